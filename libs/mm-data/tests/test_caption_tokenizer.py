"""The tiny caption tokenizer covers every synthetic caption word and applies its template."""

from mm_data import caption_vocabulary, write_caption_tokenizer


def test_caption_words_get_their_own_ids_and_the_template_is_applied(tmp_path):
    specials = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    tok = write_caption_tokenizer(tmp_path / "tok", special_tokens=specials, template="$A </s>")
    vocab = tok.get_vocab()
    assert len(tok) == 3 + len(caption_vocabulary()) and vocab["<pad>"] == 0
    ids = tok("A Red square moving LEFT zebra").input_ids
    assert ids == [vocab[w] for w in ("a", "red", "square", "moving", "left")] + [
        vocab["<unk>"],
        vocab["</s>"],
    ]
    padded = tok(["a red square"], padding="max_length", max_length=6).input_ids[0]
    assert padded[-2:] == [0, 0]


def test_left_padding_and_a_bos_template(tmp_path):
    specials = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"}
    tok = write_caption_tokenizer(
        tmp_path / "tok", special_tokens=specials, template="<bos> $A", padding_side="left"
    )
    ids = tok(["red circle"], padding="max_length", max_length=5).input_ids[0]
    assert ids[:2] == [0, 0] and ids[2] == tok.get_vocab()["<bos>"]

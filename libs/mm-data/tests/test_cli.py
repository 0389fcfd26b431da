from pathlib import Path

from mm_data.cli import main


def test_make_synthetic_then_inspect_and_check(tmp_path: Path, capsys):
    assert (
        main(["make-synthetic", str(tmp_path), "--num-clips", "2", "--corrupt", "1", "--size", "32x48"]) == 0
    )
    meta = Path(capsys.readouterr().out.strip())
    assert meta == tmp_path / "metadata.json"
    assert main(["inspect", str(meta)]) == 0
    out = capsys.readouterr().out
    assert "3 samples" in out and "(32, 48)" in out
    assert main(["check", str(meta), "--num-frames", "17", "--height", "16", "--width", "16"]) == 1
    out = capsys.readouterr().out
    assert "1 bad" in out and str(tmp_path / "clip_0002.mp4") in out

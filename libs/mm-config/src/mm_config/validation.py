"""``training.validation``: sampled clips and a held-out loss during training."""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import ConfigModel, InputPath
from .errors import Problem, RuleViolations


class ValidationConfig(ConfigModel):
    """Every ``interval`` optimizer steps the run (1) samples one clip per prompt, written to
    ``<log_dir or save>/validation/iter_<step>/<prompt index>.mp4`` (its audio beside it as ``.wav`` for a
    model that samples sound, LTX-2; both logged to the trackers: ``training.tensorboard``,
    ``training.wandb``), and (2) computes ``val_loss`` on the held-out samples of ``data_path`` at fixed
    timesteps and fixed noise, logged with that step's metrics.

    Every rank takes part (sharded sub-models need all of them). Draws are keyed by prompt seed or
    held-out sample index, never by rank: the same config writes the same clips and loss at any
    layout. The model plugin implements the hooks (``sample`` and the pipeline's
    ``validation_loss``); a plugin without them is refused before training starts.
    """

    interval: int = Field(default=500, ge=1)
    """Validate after every this many optimizer steps (steps ``interval``, ``2 x interval``, ...)."""
    prompts: list[str] = []
    """Prompts to sample one clip each for; empty = no clips."""
    seeds: list[int] | None = None
    """Noise seed of each prompt's clip (as many as ``prompts``); None = 0, 1, 2, ... by prompt index."""
    negative_prompt: str = ""
    """The unconditional prompt of classifier-free guidance (only with ``guidance_scale`` != 1)."""
    num_frames: int = Field(default=81, ge=1)
    """Frames of each clip (the model's frame rule applies, e.g. 4k+1 for Wan)."""
    height: int = Field(default=480, ge=1)
    """Clip height in pixels."""
    width: int = Field(default=832, ge=1)
    """Clip width in pixels."""
    sampling_steps: int = Field(default=20, ge=1)
    """Denoising steps per clip."""
    guidance_scale: float = Field(default=1.0, ge=0)
    """Classifier-free guidance scale; 1 = no guidance (one forward per step). For a model that samples
    sound (LTX-2) the video's, and the audio's too unless ``audio_guidance_scale`` is set."""
    audio_guidance_scale: float | None = Field(default=None, ge=0)
    """Classifier-free guidance scale of the audio stream of a model that samples sound (LTX-2, as
    diffusers' ``LTX2Pipeline`` takes ``audio_guidance_scale``); None = ``guidance_scale``. The
    unconditional forward runs when either scale is not 1; a stream at 1 takes the conditional prediction.
    Refused for a model that samples no audio."""
    shift: float | None = Field(default=None, gt=0)
    """Time shift of the sampling sigma schedule; None = the model's own (Wan2.2: 5, LTX-2: ``exp(mu)`` of
    the clip's video token count, as ``ltx2-train sample``)."""
    fps: int = Field(default=16, ge=1)
    """Frame rate written into the clips (and, for a model conditioned on it, the rate it samples at:
    LTX-2's time positions and audio length)."""
    data_path: InputPath | None = None
    """Held-out samples for ``val_loss``, read by the ``data.dataset_id`` dataset with the ``data.dataset``
    options, like the training data: a metadata file or caption folder (``video_text``), a cache folder
    (the cached datasets: the held-out clips preprocessed like the training ones); None = no validation loss."""
    ema: bool = False
    """Sample the clips and compute ``val_loss`` with the EMA of the trainable weights (``training.ema``,
    which must be set) in place of the trained ones, put back afterwards: the weights ``export --ema``
    writes, averaged over the last ``1 / (1 - decay)`` steps (Flow-GRPO's public trainer evaluates its EMA
    so). False: the trained weights."""
    loss_timesteps: int = Field(default=4, ge=1)
    """Fixed timesteps of the validation loss: evenly spaced over the range the run trains (an
    A14B expert: its own range); ``val_loss`` is the mean over held-out samples and these timesteps."""

    @model_validator(mode="after")
    def _something_to_do(self) -> ValidationConfig:
        problems = []
        if not self.prompts and self.data_path is None:
            problems.append(
                Problem(
                    ("prompts",),
                    "training.validation needs prompts (clips) or data_path (a held-out loss), or both",
                    self.prompts,
                    deps=(("data_path",),),
                )
            )
        if self.seeds is not None and len(self.seeds) != len(self.prompts):
            problems.append(
                Problem(
                    ("seeds",),
                    f"expected one seed per prompt ({len(self.prompts)}), got {len(self.seeds)}",
                    self.seeds,
                    deps=(("prompts",),),
                )
            )
        if problems:
            raise RuleViolations(problems)
        return self

    def prompt_seeds(self) -> list[int]:
        """The seed of each prompt's clip (``seeds``, else the prompt indices)."""
        return list(self.seeds) if self.seeds is not None else list(range(len(self.prompts)))


__all__ = ["ValidationConfig"]

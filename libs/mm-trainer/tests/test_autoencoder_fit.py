"""fit_autoencoder: a short fit makes a diffusers-style autoencoder reconstruct its samples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mm_data import psnr
from mm_trainer import (
    fit_autoencoder,
    fit_report,
    latent_statistics,
    posterior_means,
    reconstruct,
    save_fitted,
)
from torch import nn


class TinyAutoencoder(nn.Module):
    """encode(x).latent_dist.mean / decode(z).sample, the interface of diffusers' VAEs."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(8, 4), nn.Linear(4, 8)

    def encode(self, x):
        return SimpleNamespace(latent_dist=SimpleNamespace(mean=self.enc(x)))

    def decode(self, z):
        return SimpleNamespace(sample=self.dec(z))

    def save_pretrained(self, folder):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        torch.save(self.state_dict(), folder / "weights.pt")


def samples() -> torch.Tensor:
    basis = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    return torch.randn(16, 4, generator=torch.Generator().manual_seed(1)) @ basis  # rank 4: reconstructible


def test_a_fit_reduces_the_reconstruction_error_and_is_deterministic_for_a_seed():
    x = samples()
    errors, weights = [], []
    for _ in range(2):
        torch.manual_seed(0)
        model = TinyAutoencoder()
        before = (reconstruct(model, x) - x).pow(2).mean()
        fit = fit_autoencoder(model, x, steps=300, lr=1e-2, batch_size=4, seed=3)
        errors.append((reconstruct(model, x) - x).pow(2).mean() / before)
        weights.append(model.dec.weight.detach().clone())
    assert fit.steps == 300 and not model.training
    assert errors[0] < 0.05
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=0)


def test_zero_steps_leave_the_model_as_it_is_and_negative_steps_are_refused():
    model = TinyAutoencoder()
    before = model.dec.weight.detach().clone()
    fit = fit_autoencoder(model, samples(), steps=0)
    assert fit.steps == 0 and torch.equal(model.dec.weight, before)
    assert fit.report(16, psnr_db=12.345) == {
        "psnr_db": 12.35,
        "fit_steps": 0,
        "fit_seconds": 0.0,
        "samples": 16,
    }
    with pytest.raises(ValueError, match="steps must be >= 0"):
        fit_autoencoder(model, samples(), steps=-1)


def test_latent_statistics_are_per_channel_over_every_other_dim():
    latents = torch.stack([torch.full((2, 3), 1.0), torch.full((2, 3), 3.0)], dim=1)  # [2, C=2, 3]
    mean, std = latent_statistics(latents)
    assert mean == [1.0, 3.0] and std == pytest.approx([1e-6, 1e-6])
    assert posterior_means(TinyAutoencoder(), samples()).shape == (16, 4)


def test_a_saved_fit_is_found_again_and_a_partial_one_is_not(tmp_path):
    folder = tmp_path / "vae"
    assert fit_report(folder) is None
    save_fitted(TinyAutoencoder(), folder, {"psnr_db": 30.0})
    assert fit_report(folder) == {"psnr_db": 30.0}
    assert not (tmp_path / "vae.partial").exists()
    (folder / "config.json").unlink()
    assert fit_report(folder) is None


def test_fit_or_reuse_fits_once_per_samples_seed_and_settings_and_records_statistics_and_psnr(tmp_path):
    from mm_trainer import fit_or_reuse_autoencoder, fit_summary

    x = samples().clamp(-1, 1)
    built, recorded = [], []

    def build():
        built.append(TinyAutoencoder())
        return built[-1]

    def fit(data, seed=0, lr=1e-2):
        return fit_or_reuse_autoencoder(
            build, tmp_path / "vae", data, steps=50, seed=seed, lr=lr, batch_size=4, l1_weight=0.0,
            set_statistics=lambda model, mean, std: recorded.append((mean, std)),
        )  # fmt: skip

    first = fit(x)
    assert len(built) == 1 and first["fit_steps"] == 50 and first["samples"] == 16 and first["seed"] == 0
    assert first["fit"] == {"batch_size": 4, "l1_weight": 0.0, "lr": 1e-2}
    assert recorded == [latent_statistics(posterior_means(built[0], x))]
    assert first["psnr_db"] == pytest.approx(psnr(reconstruct(built[0], x).clamp(-1, 1), x), abs=0.01)
    assert fit(x.clone()) == first and len(built) == 1  # the same samples, seed and settings: reused
    other = fit(x.flip(0))
    assert (
        other["samples_sha256"] != first["samples_sha256"] and len(built) == 2
    )  # other samples: fitted again
    assert fit(x.flip(0), seed=1)["seed"] == 1 and len(built) == 3  # another seed: fitted again
    assert fit(x.flip(0), seed=1, lr=5e-3)["fit"]["lr"] == 5e-3 and len(built) == 4  # other settings
    assert fit_summary(tmp_path / "vae").startswith("tiny VAE reconstruction PSNR on the 16 clips: ")
    assert "random weights" in fit_summary(tmp_path / "none")


def test_the_l1_term_is_weighted():
    x = samples()
    finals = []
    for l1_weight in (1.0, 0.0):
        torch.manual_seed(0)
        finals.append(
            fit_autoencoder(TinyAutoencoder(), x, steps=1, batch_size=4, l1_weight=l1_weight).final_loss
        )
    torch.manual_seed(0)
    batch = x[torch.randint(0, 16, (4,), generator=torch.Generator().manual_seed(0))]  # the fit's first draw
    error = reconstruct(TinyAutoencoder(), batch) - batch
    want = [(error.pow(2).mean() + error.abs().mean()).item(), error.pow(2).mean().item()]
    assert finals == pytest.approx(want)

"""MAR's KL-16 autoencoder: the official parameter layout, names mapped both ways, strict loading of
kl16.ckpt (its training-loss entries left out), and the shapes of encoding and decoding."""

import json

import pytest
import torch

from conftest import FIXTURES
from visualspec.models.kl_vae import KLAutoencoder, from_official, to_official

OFFICIAL = json.loads((FIXTURES / "mar_kl16_keys.json").read_text())["keys"]


def test_the_autoencoder_has_the_official_keys_and_shapes():
    with torch.device("meta"):
        model = KLAutoencoder()
    ours = {to_official(k, 5): list(v.shape) for k, v in model.state_dict().items()}
    assert ours == OFFICIAL
    assert all(from_official(to_official(k, 5), 5) == k for k in model.state_dict())


def tiny() -> KLAutoencoder:
    torch.manual_seed(0)
    model = KLAutoencoder(ch=32)  # 32 channels: GroupNorm's 32 groups still divide every width
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return model.eval()


def test_kl16_ckpt_loads_strictly_without_its_loss_entries(tmp_path):
    model = tiny()
    official = {to_official(k, 5): v for k, v in model.state_dict().items()}
    path = tmp_path / "kl16.ckpt"
    torch.save({"model": {**official, "loss.logvar": torch.zeros(1), "loss.discriminator.main.0.weight": torch.zeros(2)}},
               path)
    loaded = KLAutoencoder.from_kl16_checkpoint(str(path), ch=32)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.encode(x).mean, model.encode(x).mean)
    official.pop("decoder.up.0.block.0.conv1.weight")
    torch.save({"model": official}, path)
    with pytest.raises(ValueError, match=r"missing \(decoder\.conv_blocks\.4\.res\.0\.conv1\.weight\)"):
        KLAutoencoder.from_kl16_checkpoint(str(path), ch=32)


def test_encoding_and_decoding_shapes():
    model = tiny()
    with torch.no_grad():
        posterior = model.encode(torch.randn(2, 3, 64, 64))
        assert posterior.mean.shape == (2, 16, 4, 4) and bool((posterior.std > 0).all())
        assert model.decode(posterior.mean).shape == (2, 3, 64, 64)

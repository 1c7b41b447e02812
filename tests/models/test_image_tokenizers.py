"""Lumina-mGPT's image tokenizers: Chameleon's VQGAN and SBER-MoVQGAN 270M. The official parameter
layouts (fixtures read off the official module definitions), strict loading of the original
checkpoint files (training-only entries left out, anything else named), the LlamaGen tokenizer
interface, save/load through diffusers, and MoVQ's latent-conditioned spatial norm."""

import json

import pytest
import torch
import yaml

from conftest import FIXTURES
from visualspec.models.chameleon_vqgan import CHAMELEON_TRAINING_PREFIXES, ChameleonVQGAN
from visualspec.models.movqgan import MOVQ_TRAINING_PREFIXES, MoVQGAN, SpatialNorm

# about 12k parameters; 2 GroupNorm groups divide every width
TINY = dict(codebook_size=32, codebook_embed_dim=4, ch=4, ch_mult=(1, 2), num_res_blocks=1, z_channels=4,
            resolution=16, norm_groups=2)
TINY_ATTN = {ChameleonVQGAN: (), MoVQGAN: (8,)}  # MoVQ: attention at the lowest level, as in the 270M model
FIXTURE = {ChameleonVQGAN: "chameleon_vqgan_keys.json", MoVQGAN: "movqgan_270m_keys.json"}
DROPPED = {ChameleonVQGAN: CHAMELEON_TRAINING_PREFIXES, MoVQGAN: MOVQ_TRAINING_PREFIXES}
MODELS = [ChameleonVQGAN, MoVQGAN]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny CPU workloads


def tiny(cls, seed=0):
    torch.manual_seed(seed)
    model = cls(**TINY, attn_resolutions=TINY_ATTN[cls])
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def write_original(cls, state, tmp_path, extra=None, wrap=True):
    """An original-style checkpoint holding ``state`` (plus ``extra`` entries); for Chameleon also
    its vqgan.yaml. Returns ``from_original``'s positional and keyword arguments."""
    state = {**state, **(extra or {})}
    ckpt = tmp_path / f"{cls.__name__}.ckpt"
    if cls is MoVQGAN:
        torch.save({"state_dict": state, "global_step": 7} if wrap else state, ckpt)
        return (str(ckpt),), {**TINY, "attn_resolutions": TINY_ATTN[cls]}
    torch.save({"state_dict": state, "global_step": 7, "epoch": 1}, ckpt)
    ddconfig = dict(double_z=False, z_channels=TINY["z_channels"], resolution=TINY["resolution"], in_channels=3,
                    out_ch=3, ch=TINY["ch"], ch_mult=list(TINY["ch_mult"]), num_res_blocks=TINY["num_res_blocks"],
                    attn_resolutions=[], dropout=0.0)
    config = {"model": {"target": "taming.models.vqgan.VQModel",
                        "params": {"embed_dim": TINY["codebook_embed_dim"], "n_embed": TINY["codebook_size"],
                                   "ddconfig": ddconfig,
                                   "lossconfig": {"target": "taming.modules.losses.vqperceptual.VQLPIPS",
                                                  "params": {"disc_start": 0}}}}}
    (tmp_path / "vqgan.yaml").write_text(yaml.safe_dump(config))
    return (str(ckpt), str(tmp_path / "vqgan.yaml")), {"norm_groups": TINY["norm_groups"]}


# entries the original training checkpoints hold besides the model (MoVQ: also LitEma shadow copies)
LOSS = {"loss.logvar": torch.zeros(()), "loss.discriminator.main.0.weight": torch.zeros(2, 3, 4, 4),
        "loss.perceptual_loss.net.slice1.0.weight": torch.zeros(2, 3, 3, 3)}
TRAINING_ONLY = {ChameleonVQGAN: LOSS,
                 MoVQGAN: {**LOSS, "ema_decoder.conv_inweight": torch.zeros(4, 4, 3, 3),
                           "ema_encoder.num_updates": torch.tensor(3),
                           "ema_quantize.embeddingweight": torch.zeros(2, 4)}}


@pytest.mark.parametrize("cls", MODELS)
def test_the_full_size_model_has_the_official_keys_and_shapes(cls):
    with torch.device("meta"):
        model = cls()
    official = json.loads((FIXTURES / FIXTURE[cls]).read_text())["keys"]
    kept = {k: v for k, v in official.items() if not k.startswith(DROPPED[cls])}  # as from_original does
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == kept


@pytest.mark.parametrize("cls", MODELS)
def test_the_original_checkpoint_loads_strictly_and_round_trips(cls, tmp_path):
    model = tiny(cls)
    assert 1000 < sum(p.numel() for p in model.parameters()) < 20000
    args, config = write_original(cls, model.state_dict(), tmp_path, TRAINING_ONLY[cls])
    loaded = cls.from_original(*args, **config)
    assert not loaded.training
    assert tuple(loaded.config.ch_mult) == (1, 2)
    assert loaded.config.codebook_l2_norm is False and loaded.config.codebook_embed_dim == 4
    assert loaded.downsample_factor == 2 and loaded.codebook_size == 32
    saved = model.state_dict()
    assert loaded.state_dict().keys() == saved.keys()
    assert all(torch.equal(v, saved[k]) for k, v in loaded.state_dict().items())
    assert loaded.codebook_vectors().shape == (32, 4)

    codes = torch.randint(0, 32, (2, 3, 5))
    with torch.no_grad():
        images = loaded.decode_code(codes)
        assert images.shape == (2, 3, 6, 10)
        flat = loaded.decode_code(codes.reshape(2, 15), shape=(2, 4, 3, 5))  # LlamaGen's qzshape form
        assert torch.equal(flat, images)
        assert loaded.decode_code(codes, clamp=True).abs().max() <= 1.0

        x = torch.rand(2, 3, 8, 12) * 2 - 1
        quantized, indices = loaded.encode(x)
        assert quantized.shape == (2, 4, 4, 6) and indices.shape == (2, 4, 6) and indices.dtype == torch.long
        latents = loaded.encode_latents(x).permute(0, 2, 3, 1).reshape(-1, 4)
        nearest = torch.cdist(latents, loaded.codebook_vectors()).argmin(dim=1)  # raw vectors, no L2 norm
        assert torch.equal(indices.reshape(-1), nearest)
        assert torch.equal(quantized, loaded.get_codebook_entry(indices))
        assert loaded.decode_code(indices).shape == (2, 3, 8, 12)


def test_movqgan_also_reads_a_plain_state_dict(tmp_path):
    model = tiny(MoVQGAN)
    args, config = write_original(MoVQGAN, model.state_dict(), tmp_path, wrap=False)
    loaded = MoVQGAN.from_original(*args, **config)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())


@pytest.mark.parametrize("cls", MODELS)
def test_missing_unexpected_and_absent_files_are_named(cls, tmp_path):
    model = tiny(cls)
    dropped = "decoder.up.0.block.1.norm2." + ("norm_layer.weight" if cls is MoVQGAN else "weight")
    state = {k: v for k, v in model.state_dict().items() if k != dropped}
    args, config = write_original(cls, state, tmp_path)
    with pytest.raises(ValueError, match=r"missing \(" + dropped.replace(".", r"\.")):
        cls.from_original(*args, **config)

    args, config = write_original(cls, model.state_dict(), tmp_path, {"discriminator.main.0.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"unexpected \(discriminator\.main\.0\.weight\)"):
        cls.from_original(*args, **config)

    absent = str(tmp_path / "nowhere" / "vqgan.ckpt")
    with pytest.raises(FileNotFoundError, match="nowhere/vqgan.ckpt"):
        cls.from_original(absent, *args[1:], **config)


def test_a_kl_autoencoder_yaml_is_refused(tmp_path):
    args, config = write_original(ChameleonVQGAN, tiny(ChameleonVQGAN).state_dict(), tmp_path)
    spec = yaml.safe_load((tmp_path / "vqgan.yaml").read_text())
    spec["model"]["params"]["ddconfig"]["double_z"] = True
    (tmp_path / "vqgan.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="double_z"):
        ChameleonVQGAN.from_original(*args, **config)


@pytest.mark.parametrize("cls", MODELS)
def test_save_pretrained_and_from_pretrained_give_the_same_images(cls, tmp_path):
    model = tiny(cls)
    model.save_pretrained(tmp_path / "tok")
    assert (tmp_path / "tok" / "diffusion_pytorch_model.safetensors").exists()
    again = cls.from_pretrained(tmp_path / "tok").eval()
    codes = torch.randint(0, 32, (1, 4, 4))
    with torch.no_grad():
        assert torch.equal(again.decode_code(codes), model.decode_code(codes))


def test_spatial_norm_scales_and_shifts_the_group_norm_per_pixel_from_the_resized_latent():
    torch.manual_seed(1)
    norm = SpatialNorm(8, 4, groups=4, eps=1e-6)
    for p in norm.parameters():
        torch.nn.init.normal_(p)
    f, zq = torch.randn(2, 8, 6, 4), torch.randn(2, 4, 3, 2)
    up = zq.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)  # nearest resize by 2
    expected = norm.norm_layer(f) * norm.conv_y(up) + norm.conv_b(up)
    torch.testing.assert_close(norm(f, zq), expected)
    assert not torch.allclose(norm(f, zq), norm(f, zq.flip(2)))


def test_movq_decoder_reads_the_codes_through_its_norms():
    """decode gives the norms the code vectors themselves (not post_quant_conv's output, which is
    the decoder's input). Same decoder input, different latents in the norms -> different images;
    with the norms' conv_y / conv_b made constant (scale 1, shift 0) every norm is a plain GroupNorm
    and the latents in the norms no longer matter."""
    model = tiny(MoVQGAN)
    z = torch.randn(1, TINY["z_channels"], 4, 4)
    zq_a, zq_b = torch.randn(2, 1, 4, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(model.decode(zq_a), model.decoder(model.post_quant_conv(zq_a), zq_a))
        assert not torch.allclose(model.decoder(z, zq_a), model.decoder(z, zq_b), atol=1e-3)
        norms = [m for m in model.decoder.modules() if isinstance(m, SpatialNorm)]
        assert len(norms) == 2 * 6 + 3 + 1  # 2 in each of 6 ResNet blocks, 1 in each of 3 attentions, norm_out
        for m in norms:
            m.conv_y.weight.zero_(), m.conv_y.bias.fill_(1.0), m.conv_b.weight.zero_(), m.conv_b.bias.zero_()
        torch.testing.assert_close(model.decoder(z, zq_a), model.decoder(z, zq_b))
        f = torch.randn(1, norms[0].norm_layer.num_channels, 4, 4)
        torch.testing.assert_close(norms[0](f, zq_a), norms[0].norm_layer(f))

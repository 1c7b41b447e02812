"""A new pipeline family needs only its own files: a throwaway family, written here and nowhere
else, gets `generate`, `batch` and `bench` from what it declares (pipelines/image.py), and the
tools name no pipeline family."""

import json
import re

import pytest
import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from conftest import ROOT
from visualspec.core.engine import Requests, decode
from visualspec.core.sampling import SamplingConfig, make_generator
from visualspec.pipelines import TokenImagePipeline, register_pipeline
from visualspec.tools.cli import main

COLOURS = ("red", "green", "blue", "white")


class ToyBigram(ModelMixin, ConfigMixin):
    """Next token from the last one and the prompt's colour: a token model of the engine's protocol
    (refill and select included, so continuous batching works)."""

    @register_to_config
    def __init__(self, grid: int = 4, seed: int = 0):
        super().__init__()
        self.vocab_size = len(COLOURS)
        self.transition = torch.nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(seed)))

    def prefill(self, prefix, max_new_tokens):
        self.bias = prefix.clone()
        return self.bias.clone()

    def forward_window(self, tokens, start):
        return self.transition[tokens] + self.bias[:, None]

    def crop(self, lengths):
        pass

    def refill(self, rows, prefix):
        self.bias[rows] = prefix
        return prefix.clone()

    def select(self, rows):
        self.bias = self.bias[rows]


@register_pipeline
class ToyGridPipeline(TokenImagePipeline):
    display_name = "the toy grid"
    decoding_modes = ("sjd", "ar")
    bench_modes = {"ar": dict(decoding="ar"), "sjd": dict(decoding="sjd")}
    default_bench_modes = ("ar", "sjd")

    def __init__(self, transformer: ToyBigram):
        super().__init__()
        self.register_modules(transformer=transformer)

    def _prefix(self, prompts):
        bias = torch.zeros(len(prompts), len(COLOURS))
        for row, prompt in enumerate(prompts):
            for word in prompt.split():
                if word in COLOURS:
                    bias[row, COLOURS.index(word)] = 3.0
        return bias

    def check_prompt(self, prompt):
        if not prompt.strip():
            raise ValueError("the prompt is empty")

    def acceptance_grid(self):
        return self.transformer.config.grid, self.transformer.config.grid

    @torch.no_grad()
    def __call__(self, prompt, *, decoding="sjd", window="auto", temperature=1.0, num_images_per_prompt=1,
                 batch_size=None, seed=None, generator=None, output_type="pil", return_dict=True):
        prompts = [p for p in ([prompt] if isinstance(prompt, str) else prompt) for _ in range(num_images_per_prompt)]
        self.check_token_options(decoding, window, "random", False)
        self.check_common(output_type, num_images_per_prompt, batch_size)
        model, g = self.transformer, self.transformer.config.grid
        sampling, slots = SamplingConfig(temperature=temperature), min(batch_size or len(prompts), len(prompts))
        prefix = (Requests(len(prompts), lambda ids: self._prefix([prompts[i] for i in ids]), slots)
                  if slots < len(prompts) else self._prefix(prompts))
        drafter, rule = self.token_decoding(decoding, sampling, vocab_size=len(COLOURS), grid_width=g,
                                            jacobi_init="random", coupling=False)
        if window == "auto":  # a policy the engine follows, decoding as AR where no window beats it
            window = (self.auto_window(model, self._prefix(prompts[:slots]), g * g, sampling, drafter, rule)
                      if drafter else 1)
        tokens, stats = decode(model, prefix, g * g, sampling, drafter=drafter, rule=rule, window=window,
                               generator=make_generator(seed, generator), mode=decoding)
        return self.output(tokens, stats, output_type, return_dict, self.decode_images)

    def decode_images(self, tokens):
        palette = torch.tensor([[1.0, -1, -1], [-1, 1, -1], [-1, -1, 1], [1, 1, 1]])
        g = self.transformer.config.grid
        return palette[tokens].view(-1, g, g, 3).permute(0, 3, 1, 2).repeat_interleave(4, 2).repeat_interleave(4, 3)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy")
    ToyGridPipeline(ToyBigram()).save_pretrained(path)
    return path


def test_the_throwaway_family_generates_from_the_command_line(folder, tmp_path, capsys):
    out, amap = tmp_path / "toy.png", tmp_path / "map.png"
    assert main(["generate", "a photo of a red circle", "--model", str(folder), "--window", "3", "--seed", "1",
                 "-o", str(out), "--stats", "--acceptance-map", str(amap)]) == 0
    assert out.is_file() and amap.is_file() and '"mode": "sjd"' in capsys.readouterr().out
    assert main(["generate", "a photo of a red circle", "--model", str(folder), "--top-k", "3", "-o", str(out)]) == 2
    assert ("--top-k is not an option of the toy grid (ToyGridPipeline): it takes --decoding, --window and "
            "--temperature") in capsys.readouterr().err
    assert main(["generate", "a photo of a red circle", "--model", str(folder), "--decoding", "lantern",
                 "-o", str(out)]) == 2
    assert "'lantern' is not built for the toy grid" in capsys.readouterr().err


def test_the_throwaway_family_runs_batch_sharded_and_resumed(folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a photo of a red circle\na photo of a blue square\na photo of a white triangle\n")
    common = ["batch", "--model", str(folder), "--prompts", str(prompts), "--images-per-prompt", "3",
              "--batch-size", "2", "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    assert json.loads((tmp_path / "one" / "batch_config.json").read_text())["window_costs"]
    for rank in ("0", "1"):
        assert main([*common, "--out", str(tmp_path / "two"), "--rank", rank, "--world-size", "2"]) == 0

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in root.rglob("*.png")}

    assert len(files(tmp_path / "one")) == 9 and files(tmp_path / "one") == files(tmp_path / "two")


def test_the_throwaway_family_is_benchmarked_side_by_side(folder, tmp_path):
    result = tmp_path / "bench.json"
    assert main(["bench", "--model", str(folder), "--images", "2", "--window", "4", "--json", str(result)]) == 0
    runs = json.loads(result.read_text())
    assert set(runs["results"]) == {"ar", "sjd"} and runs["results"]["sjd"]["forwards_ratio_to_ar"] < 1


def test_the_tools_and_the_app_name_no_pipeline_family():
    """Commands read what a pipeline declares: no family class appears in visualspec/tools or the app."""
    import visualspec.pipelines as pipelines

    families = [name for name in pipelines.__all__ if name.endswith("Pipeline")
                and name not in ("VisualSpecPipeline", "ImagePipeline", "TokenImagePipeline", "NextFramePipeline")]
    assert "LlamaGenPipeline" in families and "UnifiedARPipeline" in families
    sources = [*sorted((ROOT / "visualspec" / "tools").rglob("*.py")), ROOT / "app.py"]
    for path in sources:
        found = [name for name in families if re.search(rf"\b{name}\b", path.read_text())]
        assert not found, f"{path.relative_to(ROOT)} names {found}"

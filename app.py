"""visualspec demo app (Gradio): prompt to image with speculative decoding, side by side with AR.

    python app.py                 # http://127.0.0.1:7860
    python app.py --model FOLDER --host 0.0.0.0 --port 8080

The app binds to 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import json

from visualspec.cli import load_pipeline

MODES = ["sjd", "lantern", "ar"]


class ImageDemo:
    """The functions behind the image tab (plain Python, so they can be tested without a browser)."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.grid = pipe.transformer.grid_size

    def generate(self, prompt: str, decoding: str, guidance_scale: float, seed: int):
        out = self.pipe(prompt, decoding=decoding, guidance_scale=guidance_scale, seed=int(seed))
        stats = out.stats
        return out.images[0], stats.acceptance_map_image(self.grid, self.grid), json.dumps(stats.to_dict(), indent=1)

    def compare(self, prompt: str, guidance_scale: float, seed: int):
        """AR and SJD on the same prompt and seed, one after the other."""
        rows = []
        images = []
        for mode in ("ar", "sjd"):
            out = self.pipe(prompt, decoding=mode, guidance_scale=guidance_scale, seed=int(seed))
            images.append(out.images[0])
            rows.append([mode, out.stats.target_forwards, round(out.stats.mean_accepted, 2),
                         round(out.stats.wall_time_s, 3)])
        rows.append(["AR / SJD", round(rows[0][1] / rows[1][1], 2), "", round(rows[0][3] / rows[1][3], 2)])
        return images[0], images[1], rows


def build_demo(pipe):
    import gradio as gr

    demo_fns = ImageDemo(pipe)
    guidance = float(pipe.config.default_guidance_scale)
    with gr.Blocks(title="visualspec") as demo:
        gr.Markdown("# visualspec\nAutoregressive image generation with speculative decoding.")
        with gr.Tab("Image"):
            with gr.Row():
                with gr.Column():
                    prompt = gr.Textbox(label="Prompt", value="a photo of a red circle")
                    decoding = gr.Radio(MODES, value="sjd", label="Decoding")
                    scale = gr.Slider(0, 10, value=guidance, step=0.5, label="Guidance scale")
                    seed = gr.Number(value=0, precision=0, label="Seed")
                    run = gr.Button("Generate", variant="primary")
                    compare = gr.Button("AR vs SJD")
                with gr.Column():
                    image = gr.Image(label="Image", type="pil")
                    amap = gr.Image(label="Acceptance map (dark: fixed early)", type="pil")
                    stats = gr.Code(label="Decode statistics", language="json")
            with gr.Row():
                ar_image = gr.Image(label="AR", type="pil")
                sjd_image = gr.Image(label="SJD", type="pil")
            table = gr.Dataframe(headers=["mode", "target forwards", "accepted/step", "seconds"], label="Side by side")
            run.click(demo_fns.generate, [prompt, decoding, scale, seed], [image, amap, stats])
            compare.click(demo_fns.compare, [prompt, scale, seed], [ar_image, sjd_image, table])
    return demo


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="pipeline folder (default: the shipped model)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1, local only)")
    parser.add_argument("--port", type=int, default=7860)
    args = parser.parse_args(argv)
    build_demo(load_pipeline(args.model)).launch(server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()

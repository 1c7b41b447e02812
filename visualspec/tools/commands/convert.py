"""``visualspec convert-*``: official checkpoints -> pipeline folders (safetensors)."""

from __future__ import annotations

from .options import count_arg


def register(sub, common) -> None:
    c = sub.add_parser("convert-llamagen", parents=[common], help="official LlamaGen checkpoints -> pipeline folder")
    c.add_argument("--gpt", required=True, help="GPT checkpoint (.pt / consolidated.pth)")
    c.add_argument("--gpt-model", required=True, help="size: GPT-B, GPT-L, GPT-XL, GPT-XXL, GPT-3B")
    c.add_argument("--vq", required=True, help="VQ tokenizer checkpoint (vq_ds16_c2i.pt ...)")
    c.add_argument("--vq-model", default="VQ-16", choices=["VQ-16", "VQ-8"])
    c.add_argument("--image-size", type=count_arg, default=256)
    c.add_argument("--text-encoder", help="local flan-t5-xl folder (text-conditional models)")
    c.add_argument("--key", help="checkpoint entry holding the weights (default: model, ema, module, state_dict)")
    c.add_argument("--out", required=True)
    c.set_defaults(func=convert_llamagen)

    lu = sub.add_parser("convert-lumina", parents=[common],
                        help="a Lumina-mGPT (1 or 2.0) transformers folder and its image tokenizer -> pipeline folder")
    lu.add_argument("model", help="the Lumina-mGPT checkpoint folder (transformers format, model_type chameleon)")
    lu.add_argument("--vqgan", help="Lumina-mGPT 1: Chameleon's tokenizer/vqgan.ckpt")
    lu.add_argument("--vqgan-config", help="Lumina-mGPT 1: Chameleon's tokenizer/vqgan.yaml")
    lu.add_argument("--movqgan", help="Lumina-mGPT 2.0: movqgan_270M.ckpt")
    lu.add_argument("--size", type=count_arg, default=768, help="the checkpoint's image size in pixels (512, 768, 1024)")
    lu.add_argument("--tokenizer", help="folder with the text tokenizer (default: the model folder)")
    lu.add_argument("--out", required=True)
    lu.set_defaults(func=convert_lumina)

    m = sub.add_parser("convert-mar", parents=[common], help="official MAR checkpoints -> pipeline folder")
    m.add_argument("--checkpoint", required=True, help="MAR's checkpoint-last.pth")
    m.add_argument("--vae", required=True, help="MAR's KL-16 autoencoder, kl16.ckpt")
    m.add_argument("--name", required=True, choices=("mar_base", "mar_large", "mar_huge"))
    m.add_argument("--key", default="model_ema", help="checkpoint entry holding the weights (default: model_ema)")
    m.add_argument("--out", required=True)
    m.set_defaults(func=convert_mar)


def convert_llamagen(args) -> int:
    from ...pipelines.convert import convert_llamagen as convert

    convert(args.gpt, args.vq, args.out, gpt_model=args.gpt_model, vq_model=args.vq_model,
            image_size=args.image_size, text_encoder=args.text_encoder, key=args.key)
    print(args.out)
    return 0


def convert_lumina(args) -> int:
    from ...pipelines.convert import convert_lumina as convert

    convert(args.model, args.out, vqgan=args.vqgan, vqgan_config=args.vqgan_config, movqgan=args.movqgan,
            size=args.size, tokenizer_dir=args.tokenizer)
    print(args.out)
    return 0


def convert_mar(args) -> int:
    from ...pipelines.convert import convert_mar as convert

    convert(args.checkpoint, args.vae, args.out, name=args.name, key=args.key)
    print(args.out)
    return 0

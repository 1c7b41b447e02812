"""``visualspec train-*``: the recipes of the shipped models (each resumes from its work folder)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...core.checks import check_positive_int
from ...core.home import home


def register(sub, common) -> None:
    t = sub.add_parser("train-shapes", parents=[common],
                       help="train the shapes-world model (and the FID-shapes features)")
    t.add_argument("--out", help="pipeline folder to write (e.g. assets/shapes-t2i)")
    t.add_argument("--features-out", help="also train the FID-shapes feature network into this folder")
    t.add_argument("--work-dir", default=str(home() / "train-shapes"), help="checkpoints; rerun to resume")
    # defaults (None) come from ShapesTrainingConfig, the shipped recipe
    t.add_argument("--seed", type=int, help="the model's seed (the shipped run's: 0); the FID-shapes network's is fixed")
    t.add_argument("--caption-order", choices=["raster", "random"],
                   help="name two objects in the order they are drawn (the shipped model's recipe) or in either order")
    t.add_argument("--caption-positions", action=argparse.BooleanOptionalAction,
                   help="give the GPT's caption prefix a learned embedding per slot (the shipped recipe)")
    t.add_argument("--text-steps", type=int,
                   help="first train the text encoder this many steps to predict each word's neighbours, so its "
                        "features carry word order, then freeze it (the shipped recipe: 500; 0: no text stage, "
                        "the encoder trains with the GPT)")
    t.set_defaults(func=checked(train_shapes))

    t = sub.add_parser("train-drafter", parents=[common],
                       help="train an EAGLE-style feature drafter for a text pair's target or a shapes pipeline, "
                            "distil a text pair's draft model toward its target (DistillSpec) (#50), or train a "
                            "Kangaroo adapter on a text pair's target's first layers or a Chimera drafter for it")
    t.add_argument("--kind", choices=("eagle", "distill", "kangaroo", "chimera"), default="eagle",
                   help="eagle: a feature drafter (text pair or shapes pipeline); distill: the pair's draft/ "
                        "distilled on its own samples (text pairs); kangaroo: an adapter after the target's first "
                        "--exit-layer layers (text pairs); chimera: a trigram encoder, one layer over the target's "
                        "features and residual heads that draft several tokens a pass (text pairs)")
    t.add_argument("--exit-layer", type=int, help="--kind kangaroo: the target layers before the adapter "
                                                  "(the shipped recipe: see assets/text-pair/README.md)")
    t.add_argument("--pair", default=None, help="the text pair folder (default: the shipped assets/text-pair)")
    t.add_argument("--model", default=None,
                   help="a shapes-world LlamaGen pipeline folder to train for instead (e.g. assets/shapes-t2i)")
    t.add_argument("--out", required=True, help="folder to write (e.g. assets/text-pair/feature-drafter)")
    t.add_argument("--work-dir", default=None,
                   help="checkpoints; rerun to resume (default: train-drafter, or train-drafter-distill, under "
                        "visualspec's home)")
    t.add_argument("--steps", type=int, help="optimisation steps (the shipped recipes: 1500 eagle, 2000 chimera, "
                                             "800 distill)")
    t.add_argument("--feature-layers", type=int, nargs="+", metavar="I",
                   help="--kind eagle: fuse the target's hidden states at these indices (EAGLE-3; 0 the embeddings, "
                        "i the input of layer i, the last the normed output) instead of reading its last hidden "
                        "state alone")
    t.add_argument("--unroll", type=int, metavar="N",
                   help="--kind eagle: passes on the drafter's own predicted features after the teacher-forced one "
                        "(training-time test; the shipped recipes: 1)")
    t.add_argument("--step-wise", action="store_true",
                   help="--kind eagle with --unroll: each pass attends as a decode chain's draft does, the real "
                        "columns before the chain and the drafts so far (EAGLE-3), not its own columns")
    t.add_argument("--pass-decay", type=float, metavar="D",
                   help="--kind eagle: pass j's share of the loss is D**j, normalised (default 1, the mean; "
                        "EAGLE-3 uses 0.8)")
    t.add_argument("--no-feature-loss", action="store_true",
                   help="--kind eagle: the KL to the target's distribution alone, without the smooth-L1 loss on "
                        "its features (EAGLE-3)")
    t.set_defaults(func=checked(train_drafter))

    t = sub.add_parser("train-judge", parents=[common],
                       help="train a judge for judge decoding on a shapes-world LlamaGen pipeline (labels mined by "
                            "finishing images with and without each rejected draft) or, with --pair, for a text "
                            "pair's target (labels: does held-out Python stay valid and keep its next statement; #51)")
    t.add_argument("--model", default=None, help="the pipeline folder (default: the shipped assets/shapes-t2i)")
    t.add_argument("--pair", default=None,
                   help="a text pair folder to train for instead (e.g. assets/text-pair; its draft model drafts)")
    t.add_argument("--out", required=True, help="judge folder to write (e.g. assets/shapes-t2i/judge)")
    t.add_argument("--work-dir", default=None,
                   help="checkpoints; rerun to resume (default: train-judge, or train-judge-text with --pair, under "
                        "visualspec's home)")
    t.add_argument("--prompts-per-task", type=int, help="training prompts per GenEval task (the shipped recipe: 100)")
    t.add_argument("--prompts", type=int, help="with --pair: training prompts (the shipped recipe: 320)")
    t.add_argument("--hidden", type=int, help="hidden width of the head (0: logistic regression, the shipped recipe)")
    t.set_defaults(func=checked(train_judge))

    t = _shapes_fine_tune(sub, common, "train-any-order", train_any_order,
                          "teach a shapes-world LlamaGen pipeline's GPT every generation order (an any-order model "
                          "for ASSD, infilling and parallel decoding; #52)",
                          "pipeline folder to write (e.g. assets/shapes-any-order)", "the shipped recipe: see its card")
    t = _shapes_fine_tune(sub, common, "train-denoising", train_denoising,
                          "fine-tune a shapes-world LlamaGen pipeline's GPT for next-clean-token prediction from noisy "
                          "inputs, for SJD2's drafts (drafts='denoising'; #50)",
                          "pipeline folder to write", "the study's recipe: 800")
    t.add_argument("--denoising-steps", type=int, help="noise levels a drafted position falls through, from pure "
                                                       "noise to clean (the study's recipe: 4)")

    for name, func, what, out, seeded in (
            ("train-continuous", train_continuous, "train a continuous-token target and draft on the shapes world "
             "(CSpD)", "pipeline folder to write (target, draft, KL autoencoder, text encoder)", True),
            ("train-unified", train_unified, "train a Lumina-layout model (transformers' Chameleon) on the shapes "
             "world", "pipeline folder to write", True),
            ("train-arena", train_arena, "train the arena-world video model",
             "pipeline folder to write (e.g. assets/arena-nfd)", False),
            ("train-text", train_text, "train a target and draft LM pair on the Python standard library",
             "folder to write (tokenizer/, target/, draft/)", False)):
        tr = sub.add_parser(name, parents=[common], help=what)
        tr.add_argument("--out", required=True, help=out)
        tr.add_argument("--work-dir", default=str(home() / name), help="checkpoints; rerun to resume")
        if seeded:
            tr.add_argument("--seed", type=int, help="default: the recipe's (0)")
        if name == "train-arena":
            tr.add_argument("--from", dest="start_from", metavar="FOLDER",
                            help="start from this pipeline folder's trained models and run only the last stage "
                                 "(self forcing)")
        tr.set_defaults(func=checked(func))


def _shapes_fine_tune(sub, common, name: str, func, what: str, out: str, steps: str):
    """The parser of a command that fine-tunes a shapes-world pipeline's GPT (``--model``, from the
    shipped one by default; ``--out``, ``--work-dir``, ``--steps``), running ``func``."""
    t = sub.add_parser(name, parents=[common], help=what)
    t.add_argument("--model", default=None, help="the raster pipeline folder it starts from (default: the shipped "
                                                 "assets/shapes-t2i)")
    t.add_argument("--out", required=True, help=out)
    t.add_argument("--work-dir", default=str(home() / name), help="checkpoints; rerun to resume")
    t.add_argument("--steps", type=int, help=f"optimisation steps ({steps})")
    t.set_defaults(func=checked(func))
    return t


def checked(train):
    """``train`` after its folders are checked: hours of training must not end in a folder that is
    a file (``--out``, ``--features-out``, ``--work-dir``)."""
    def run(args) -> int:
        from ..paths import check_output_folder

        for option in ("out", "features_out", "work_dir"):
            if getattr(args, option, None):
                check_output_folder(getattr(args, option), "--" + option.replace("_", "-"))
        return train(args)
    return run


def train_shapes(args) -> int:
    if not (args.out or args.features_out):
        raise ValueError("train-shapes needs --out FOLDER (the pipeline), --features-out FOLDER (the FID-shapes "
                         "features), or both")
    from ...training.shapes import ShapesTrainingConfig, train_feature_net, train_shapes as train

    if args.features_out:
        train_feature_net(args.features_out)
        print(args.features_out)
    if args.out:
        options = {k: getattr(args, k) for k in ("seed", "caption_order", "caption_positions", "text_steps")}
        cfg = ShapesTrainingConfig(**{k: v for k, v in options.items() if v is not None})
        train(args.out, args.work_dir, cfg)
        print(args.out)
    return 0


def train_continuous(args) -> int:
    from ...training.continuous import ContinuousShapesConfig, train_continuous_shapes

    cfg = ContinuousShapesConfig(**({} if args.seed is None else {"seed": args.seed}))
    train_continuous_shapes(args.out, args.work_dir, cfg)
    print(args.out)
    return 0


def train_unified(args) -> int:
    from ...training.unified import UnifiedShapesConfig, train_unified_shapes

    cfg = UnifiedShapesConfig(**({} if args.seed is None else {"seed": args.seed}))
    train_unified_shapes(args.out, args.work_dir, cfg)
    print(args.out)
    return 0


def train_arena(args) -> int:
    from ...training.arena import train_arena as train

    if args.start_from and not (Path(args.start_from) / "model_index.json").is_file():
        raise ValueError(f"--from {args.start_from}: not a pipeline folder (no model_index.json)")
    train(args.out, args.work_dir, start_from=args.start_from)
    print(args.out)
    return 0


def _eagle_overrides(args) -> dict:
    """The feature drafter's recipe options given on the command line, checked: each is ``--kind
    eagle``'s alone, and its value in range."""
    given = {"--feature-layers": args.feature_layers is not None, "--unroll": args.unroll is not None,
             "--step-wise": args.step_wise, "--pass-decay": args.pass_decay is not None,
             "--no-feature-loss": args.no_feature_loss}
    misplaced = [name for name, on in given.items() if on]
    if misplaced and args.kind != "eagle":
        raise ValueError(f"{misplaced[0]} is the feature drafter's (--kind eagle)")
    if args.unroll is not None and args.unroll < 0:
        raise ValueError(f"--unroll is the feature drafter's (--kind eagle), 0 or more; got {args.unroll}")
    if args.step_wise and not args.unroll:
        raise ValueError("--step-wise is the feature drafter's (--kind eagle) and shapes its --unroll passes: "
                         "give --unroll 1 or more")
    if args.pass_decay is not None and not args.pass_decay > 0:
        raise ValueError(f"--pass-decay is the feature drafter's (--kind eagle), above 0; got {args.pass_decay}")
    options = {"feature_layers": args.feature_layers, "unroll": args.unroll, "pass_decay": args.pass_decay,
               "step_wise": True if args.step_wise else None,
               "regression_weight": 0.0 if args.no_feature_loss else None}
    return {k: v for k, v in options.items() if v is not None}


def train_drafter(args) -> int:
    from ...training.feature_drafter import (FeatureDrafterConfig, ImageFeatureDrafterConfig, train_image_feature_drafter,
                                             train_text_feature_drafter)

    if args.pair is not None and args.model is not None:
        raise ValueError("train-drafter trains for a text pair (--pair) or an image pipeline (--model), not both")
    overrides = {k: getattr(args, k) for k in ("steps",) if getattr(args, k) is not None}
    args.work_dir = args.work_dir or str(home() / ("train-drafter" if args.kind == "eagle" else
                                                   f"train-drafter-{args.kind}"))
    if args.exit_layer is not None and args.kind != "kangaroo":
        raise ValueError("--exit-layer is Kangaroo's (--kind kangaroo)")
    overrides.update(_eagle_overrides(args))
    if args.kind == "kangaroo":
        from ...training.kangaroo import KangarooConfig, train_kangaroo

        if args.model is not None:
            raise ValueError("--kind kangaroo trains for a text pair's target (--pair), not an image pipeline")
        if args.exit_layer is not None:
            overrides["exit_layer"] = args.exit_layer
        train_kangaroo(args.pair, args.out, args.work_dir, KangarooConfig(**overrides))
    elif args.kind == "distill":
        from ...training.distill import DistillConfig, train_distilled_draft

        if args.model is not None:
            raise ValueError("--kind distill distils a text pair's draft model (--pair); the shapes pipelines ship "
                             "no draft model to distil")
        train_distilled_draft(args.pair, args.out, args.work_dir, DistillConfig(**overrides))
    elif args.kind == "chimera":
        from ...training.feature_drafter import ChimeraConfig, train_text_chimera

        if args.model is not None:
            raise ValueError("--kind chimera trains for a text pair's target (--pair), not an image pipeline")
        train_text_chimera(args.pair, args.out, args.work_dir, ChimeraConfig(**overrides))
    elif args.model is not None:
        train_image_feature_drafter(args.model, args.out, args.work_dir, ImageFeatureDrafterConfig(**overrides))
    else:
        train_text_feature_drafter(args.pair, args.out, args.work_dir, FeatureDrafterConfig(**overrides))
    return 0


def train_judge(args) -> int:
    if args.pair is not None:
        from ...training.text_judge import TextJudgeConfig, train_text_judge
        from ..bench_text import load_pair, pair_folder

        if args.model is not None or args.prompts_per_task is not None:
            raise ValueError("train-judge --pair trains for a text pair's target; --model and --prompts-per-task "
                             "are the shapes judge's")
        overrides = {k: getattr(args, k) for k in ("prompts", "hidden") if getattr(args, k) is not None}
        folder = pair_folder(args.pair)
        train_text_judge(folder, *load_pair(folder), args.out, args.work_dir or str(home() / "train-judge-text"),
                         TextJudgeConfig(**overrides))
        print(args.out)
        return 0
    from ...training.judge import JudgeConfig, train_judge as train

    if args.prompts is not None:
        raise ValueError("--prompts is the text judge's (train-judge --pair); the shapes judge takes "
                         "--prompts-per-task")
    overrides = {k: getattr(args, k) for k in ("prompts_per_task", "hidden") if getattr(args, k) is not None}
    train(args.model, args.out, args.work_dir or str(home() / "train-judge"), JudgeConfig(**overrides))
    print(args.out)
    return 0


def train_any_order(args) -> int:
    from ...training.any_order import AnyOrderConfig, train_any_order as train
    from ...assets import SHAPES_T2I

    overrides = {"steps": args.steps} if args.steps is not None else {}
    train(args.model or str(SHAPES_T2I), args.out, args.work_dir, AnyOrderConfig(**overrides))
    print(args.out)
    return 0


def train_denoising(args) -> int:
    from ...training.denoising import DenoisingConfig, train_denoising_target

    overrides = {k: check_positive_int(f"--{k.replace('_', '-')}", v)
                 for k, v in (("steps", args.steps), ("denoising_steps", args.denoising_steps)) if v is not None}
    train_denoising_target(args.model, args.out, args.work_dir, DenoisingConfig(**overrides))
    print(args.out)
    return 0


def train_text(args) -> int:
    from ...training.text import train_text_pair

    train_text_pair(args.out, args.work_dir)
    print(args.out)
    return 0

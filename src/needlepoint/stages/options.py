"""The command-line form of the stage options, shared by `run`/`chat` (cli/common.py) and
`serve` (server/cli.py): `--stages N|A,B,C`, `--ray ADDRESS`, `--placement P0,P1,...`,
`--stage-cpus CPUS`."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import StagePlanError


def parse_stages(text: str) -> int | list[int]:
    """"4" -> 4 stages (balanced); "0,7,14" -> the first layer of each stage."""
    try:
        if "," in text:
            return [int(part) for part in text.split(",") if part.strip()]
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a stage count (4) or each stage's first layer (0,7,14), got {text!r}"
        ) from None


def parse_placement(text: str) -> list[str]:
    """"node_a,zone=b" -> one entry per stage (a custom resource, or label=value)."""
    return [part.strip() for part in text.split(",")]


def add_stage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", type=parse_stages, default=None, metavar="N|A,B,...",
                        help="cut the model into N stages (balanced by weight bytes), or at "
                        "these first layers (0,7,14); Needle 3, Hugging Face and GGUF models "
                        "(docs/distributed.md)")
    parser.add_argument("--ray", metavar="ADDRESS", default=None,
                        help="run the stages as Ray actors on the cluster at ADDRESS "
                        "(host:port of `ray start --head`; needs the 'ray' extra)")
    parser.add_argument("--placement", type=parse_placement, default=None,
                        metavar="P0,P1,...", help="with --ray: where each stage runs, a "
                        "custom resource name (ray start --resources) or label=value "
                        "(ray start --labels); default: spread over the nodes")
    parser.add_argument("--replicas", type=int, default=None, metavar="R",
                        help="with --stages: R copies of the stages; sessions are spread "
                        "over them and a lost replica's sessions move to another "
                        "(docs/distributed.md)")
    parser.add_argument("--stage-cpus", type=float, default=None, metavar="CPUS",
                        help="with --ray: CPUs each stage reserves on its node (default: "
                        "--threads; 0.5 lets two stages share a CPU)")


def staged_from_args(model: str | os.PathLike[str] | None, args: argparse.Namespace) -> Any:
    """The staged model the arguments ask for (of `--model`: a path, or None for
    $NEEDLEPOINT_MODEL / the bundled model), or None when they ask for none."""
    stages, address = getattr(args, "stages", None), getattr(args, "ray", None)
    placement = getattr(args, "placement", None)
    stage_cpus = getattr(args, "stage_cpus", None)
    replicas = getattr(args, "replicas", None)
    if stages is None and address is None and placement is None and stage_cpus is None \
            and replicas is None:
        return None
    if stages is None and replicas is not None and address is None and placement is None \
            and stage_cpus is None:
        raise StagePlanError("--replicas needs --stages (a count, or each stage's first "
                             "layer)")
    if stages is None:
        raise StagePlanError("--ray, --placement and --stage-cpus need --stages (a count, or "
                             "each stage's first layer)")
    if (placement is not None or stage_cpus is not None) and address is None:
        raise StagePlanError("--placement and --stage-cpus need --ray ADDRESS")
    from ..models.hub import resolve_model_path
    from .model import load_staged

    # a Hugging Face directory or a known name ("smollm2") is resolved by load_staged
    return load_staged(resolve_model_path(None) if model is None else model, stages,
                       transport="ray" if address else "local", ray_address=address,
                       placement=placement, stage_cpus=stage_cpus,
                       threads=getattr(args, "threads", None), replicas=replicas or 1)

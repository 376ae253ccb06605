"""Generate a graph-isomorphism dataset split into the data directory.

Example::

    python scripts/create_gi_dataset.py er10000 --num-pairs 10000 --seed 4000

writes ``{data-dir}/graph_isomorphism/er10000/raw/train/data.pt`` (the original
library's layout) with the generating config recorded in the file. Fields without an
option keep their defaults (``GraphIsomorphismDatasetConfig``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

try:
    import nip_core  # noqa: F401
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nip_core.scenarios.graph_isomorphism.dataset_generation import (  # noqa: E402
    GraphIsomorphismDatasetConfig,
)
from nip_core.scenarios.graph_isomorphism.named_datasets import (  # noqa: E402
    default_data_dir,
    generate_to_file,
)
from nip_core.scenarios.graph_isomorphism.raw_data import raw_data_path  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="dataset name (directory under graph_isomorphism/)")
    parser.add_argument("--num-pairs", type=int, required=True, help="number of graph pairs")
    parser.add_argument("--seed", type=int, required=True, help="seed of all randomness")
    parser.add_argument("--split", default="train", help="split name (default: train)")
    parser.add_argument(
        "--data-dir", type=Path, default=None,
        help="data directory (default: $NIPFLOW_DATA_DIR, else ~/.cache/nipflow/data)",
    )
    parser.add_argument(
        "--graph-sizes", type=int, nargs="+", default=None,
        help="graph sizes (default: 7 8 9 10 11)",
    )
    parser.add_argument(
        "--edge-probabilities", type=float, nargs="+", default=None,
        help="Erdos-Renyi edge probabilities (default: 0.2 0.4 0.6 0.8)",
    )
    parser.add_argument(
        "--num-workers", type=_num_workers, default=None,
        help="processes generating cells in parallel (default 'auto': one per usable core when "
             "the dataset would take more than a few seconds in one)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    return parser


def _num_workers(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'auto' or a whole number >= 1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
    path = raw_data_path(data_dir, args.name, args.split)
    if path.exists() and not args.overwrite:
        print(f"{path} exists; pass --overwrite to replace it", file=sys.stderr)
        return 1
    overrides = {}
    if args.graph_sizes is not None:
        overrides["graph_sizes"] = args.graph_sizes
    if args.edge_probabilities is not None:
        overrides["edge_probabilities"] = args.edge_probabilities
    config = GraphIsomorphismDatasetConfig(
        num_samples=args.num_pairs, seed=args.seed, **overrides
    )
    start = time.perf_counter()
    generate_to_file(config, path, num_workers=args.num_workers)
    print(f"wrote {path} ({args.num_pairs} pairs) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

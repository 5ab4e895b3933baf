"""What exact resume costs a rank per checkpoint: taking its resume state (random streams and
loader positions) and writing it as its file of the checkpoint.

    python benchmarks/resume_state.py [--repeat 200] [--workers 2] [--storage DIR]

In one process, as a rank holds them: torch's random streams (and each CUDA device's where
CUDA is available and started), Python's and NumPy's, and one loader from
``prepare_data_loader`` (a ``StatefulDataLoader`` with ``--workers`` worker processes) cut
mid-pass. Timed, interleaved, ``--repeat`` times each:

- ``capture``: every keeper's ``state_dict`` and the pickle of them together: the time the
  training thread spends at every report that writes a checkpoint (target: ≤ 1 ms);
- ``write``: the state file written durably into a checkpoint directory under ``--storage``
  (on the background thread with ``ASYNC``; in ``report()`` with ``SYNC``);
- ``baseline``: ``torch.get_rng_state()`` alone, the least any such state costs.

One JSON line: the medians in ms, the p90 of ``capture`` and the file's size. Then, counted
(not timed) for ``--ranks`` ranks, ``--ranks-per-node`` a node, what the state files add to
rank 0's work per checkpoint of a run where each rank writes one shard: the bytes of the
ranks' results that reach rank 0 (each rank's :class:`Persisted`, pickled as it is sent) and
the bytes of the checkpoint's file records (the records file, or the manifest's entry), each
with and without the states. The states are one file a node (``.hpckit-resume/node-NNNNN``,
#66), written by the node's first rank from its ranks' states, gathered on the node: one
record a node, in that rank's results.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset

from hpckit.integrations.torch.prepare import prepare_data_loader
from hpckit.integrations.torch.loader import random_keepers
from hpckit.run.session.resumable import RankState
from hpckit.experiment.records import FileRecord, render_records
from hpckit.run.writing.plan import Persisted
from hpckit.run.writing.writer import node_states, state_name, write_state
from hpckit.storage.location import local


class Images(Dataset):
    def __len__(self) -> int:
        return 50_000

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(3, 32, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--storage", default=None)
    parser.add_argument("--ranks", default="8,64,1024,10240",
                        type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--ranks-per-node", type=int, default=8)
    args = parser.parse_args()
    if torch.cuda.is_available():
        torch.cuda.init()
    state = RankState(rank=0, world_size=1, start=None, streams=random_keepers())
    loader = prepare_data_loader(DataLoader(Images(), batch_size=64, shuffle=True,
                                            num_workers=args.workers))
    state.keep_loader(loader)
    batches = iter(loader)
    for _ in range(10):
        next(batches)
    with tempfile.TemporaryDirectory(dir=args.storage) as directory:
        target = local(directory)
        samples: dict[str, list[float]] = {"baseline": [], "capture": [], "write": []}
        size = 0
        for _ in range(args.repeat):
            began = time.perf_counter()
            torch.get_rng_state()
            samples["baseline"].append(time.perf_counter() - began)
            began = time.perf_counter()
            data = state.capture()
            samples["capture"].append(time.perf_counter() - began)
            began = time.perf_counter()
            write_state(target, 0, node_states(range(args.ranks_per_node),
                                               [data] * args.ranks_per_node) or b"")
            samples["write"].append(time.perf_counter() - began)
            size = len(data)
    capture = sorted(samples["capture"])
    median_ms = 1000 * statistics.median(capture)
    print(json.dumps({
        "benchmark": "resume_state", "repeat": args.repeat, "loader_workers": args.workers,
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_initialized() else 0,
        "state_bytes": size, "target_capture_ms": 1.0,
        **{f"{name}_ms": round(1000 * statistics.median(values), 3)
           for name, values in samples.items()},
        "capture_p90_ms": round(1000 * capture[int(0.9 * len(capture))], 3),
        "capture_within_target": median_ms <= 1.0,
    }), flush=True)
    for ranks in args.ranks:
        print(json.dumps(counted(ranks, size, args.ranks_per_node)), flush=True)


def counted(ranks: int, state_bytes: int, per_node: int) -> dict:
    """Rank 0's bytes per checkpoint at ``ranks`` ranks, each writing one 64 MiB shard, with
    and without the states: a file a node of ``per_node`` ranks' ``state_bytes`` each,
    recorded by the node's first rank (its checksum as hpckit writes one)."""
    checksum = "xxh3-128:" + "0" * 32
    shards = [[FileRecord(f"model-rank{r:05d}.pt", 64 << 20, r, checksum)] for r in range(ranks)]
    states = [[*files, FileRecord(state_name(r), state_bytes * min(per_node, ranks - r), r,
                                  checksum)] if r % per_node == 0 else files
              for r, files in enumerate(shards)]

    def gathered(per_rank: list[list[FileRecord]]) -> int:
        return sum(len(pickle.dumps(Persisted(files))) for files in per_rank)

    def recorded(per_rank: list[list[FileRecord]]) -> int:
        return len(render_records("checkpoint_000001", [f for files in per_rank for f in files]))

    return {"benchmark": "resume_state", "counted": "rank0_bytes_per_checkpoint",
            "ranks": ranks, "ranks_per_node": per_node, "gathered_bytes": gathered(shards),
            "gathered_bytes_with_state": gathered(states), "recorded_bytes": recorded(shards),
            "recorded_bytes_with_state": recorded(states)}


if __name__ == "__main__":
    main()

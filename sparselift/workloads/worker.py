"""What each launched rank runs: `python -m sparselift.workloads.worker CONFIG RESULT_DIR`.

A rank writes its result atomically, leaves the process group, and then ends with `os._exit`:
after training, background C++ threads of the process group (gloo's, the c10d store's) can still be
joinable when the interpreter tears down static objects, which aborts the process with
"terminate called without an active exception" and turns a finished run into a failure. Exiting
directly after an orderly `destroy_process_group()` skips that teardown, so the exit code reports
what the run did. Failures go to torchelastic's error file, which the launcher reports, and the rank
exits at once without leaving the group: leaving can wait on peers still in a collective, and a peer
that fails first (its collective broken) would then be the only failure the launcher sees.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from sparselift.atomic import write_json


def quiet_library_noise() -> None:
    """TorchRec and torch warn on every rank about deprecations the user cannot act on."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch(rec)?\.")
    for name in ("torchrec", "torch.fx", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str]) -> int:
    """Train this rank of the run in CONFIG (a TrainConfig as JSON).

    argv is [CONFIG, RESULT_DIR]; the RankResult goes to RESULT_DIR/rank<R>.json.
    """
    cfg_path, out_dir = argv
    quiet_library_noise()
    from sparselift.workloads.harness import TrainConfig
    from sparselift.workloads.rank import train_rank

    cfg = TrainConfig(**json.loads(Path(cfg_path).read_text()))
    result = train_rank(cfg)
    write_json(Path(out_dir, f"rank{result.rank}.json"), asdict(result))
    return 0


if __name__ == "__main__":
    code = 0
    try:
        code = main(sys.argv[1:])
    except BaseException as e:  # every failure must reach the launcher
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        traceback.print_exc()
        ErrorHandler().record_exception(e)
        code = 1
    finally:
        try:
            import torch.distributed as dist

            if code == 0 and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # best effort: the exit code already says what the run did
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

#!/usr/bin/python3
"""Reads pstrain's TensorBoard event files with TensorBoard's own reader
(tensorboard.backend.event_processing.event_accumulator), as a user's
TensorBoard would, and prints every scalar as "TAG STEP VALUE", sorted.
tests/test_tblog.c compares them with what pstrain printed.

    build/pyvenv/bin/python tests/tb_read.py LOG_DIR
"""
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    if not tags:
        print("no scalars in", sys.argv[1], file=sys.stderr)
        return 1
    for tag in sorted(tags):
        for ev in acc.Scalars(tag):
            print(tag, ev.step, repr(ev.value))
    return 0


if __name__ == "__main__":
    sys.exit(main())

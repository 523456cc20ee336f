"""Reads mgc's --tensorboard event files back with TensorBoard's own reader
(its event file loader, which checks each record's masked CRC-32C, and its
EventAccumulator) and checks them against the run's --log:

    .venv/bin/python tests/tensorboard_check.py DIR LOG.jsonl EPOCHS STEPS_PER_EPOCH

Every epoch's scalars are the --log's numbers (float32), the step scalars
one per training step on the run's step axis, a histogram per trainable
parameter per epoch that counts its elements, the settings as a text summary.
Prints what it checked; exits 1 on the first failure."""
import glob
import json
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader


def main():
    d, log, epochs, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    files = glob.glob(f"{d}/events.out.tfevents.*")
    assert len(files) == 1, files
    events = list(event_file_loader.EventFileLoader(files[0]).Load())   # raises on a bad CRC or a truncated record
    assert events[0].file_version == "brain.Event:2", events[0]
    acc = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0,
                                                               event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    epochs_log = [r for r in (json.loads(l) for l in open(log)) if "test_acc" in r]
    assert len(epochs_log) == epochs, epochs_log
    for tag, key in (("epoch/loss", "loss"), ("epoch/train_acc", "train_acc"), ("epoch/test_acc", "test_acc"),
                     ("epoch/val_acc", "val_acc"), ("epoch/lr", "lr")):
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        want = [(r["epoch"], r[key]) for r in epochs_log]
        assert [s for s, _ in got] == [s for s, _ in want], (tag, got, want)
        assert all(abs(a - b) <= 1e-6 + 1e-6 * abs(b) for (_, a), (_, b) in zip(got, want)), (tag, got, want)
    for tag in ("train/loss", "train/accuracy", "train/lr", "train/examples_per_s"):
        got = [e.step for e in acc.Scalars(tag)]
        assert got == list(range(1, epochs * steps + 1)), (tag, got[:5], len(got))
    hists = [t for t in tags["histograms"] if t.startswith("params/")]
    assert "params/conv1.weight" in hists, hists
    h = acc.Histograms("params/conv1.weight")
    assert [e.step for e in h] == list(range(1, epochs + 1)), h
    assert all(e.histogram_value.num == 150 and sum(e.histogram_value.bucket) == 150 for e in h), h[0]
    text = acc.Tensors("run/settings")
    assert text and b"| net | lenet |" in text[0].tensor_proto.string_val[0], text
    print(f"ok   {len(events)} events, CRCs checked; {len(tags['scalars'])} scalar tags, {len(hists)} parameter histograms "
          f"a epoch, the settings; the epochs' numbers = --log's")


if __name__ == "__main__":
    main()

"""The route of a run's log records: every sink gets every record in order, on disk at once, from rank 0 only."""

import json

import pytest

from transformer.training import distributed, run_log
from transformer.training.run_log import RunLog, open_run_log

RECORDS = [{"step": 1, "kind": "train", "loss": 5.0}, {"step": 1, "kind": "valid", "valid_bleu": 2.5}]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_log_jsonl_holds_each_record_as_soon_as_it_is_written(tmp_path):
    (tmp_path / run_log.LOG).write_text(json.dumps({"step": 0, "kind": "end"}) + "\n")  # an earlier run's
    with open_run_log(tmp_path, tensorboard=False, first_step=2, config_yaml="") as log:
        for n, entry in enumerate(RECORDS, start=2):
            log.record(entry)
            assert len(_lines(tmp_path / run_log.LOG)) == n  # read while the log is open, as a kill -9 would leave it
    assert _lines(tmp_path / run_log.LOG)[1:] == RECORDS


class Kept:
    """A sink that keeps what it is given, and whether it was closed."""

    def __init__(self):
        self.entries, self.closed = [], False

    def write(self, entry):
        self.entries.append(entry)

    def close(self):
        self.closed = True


def test_every_sink_gets_every_record_and_is_closed_however_the_block_ends():
    sinks = [Kept(), Kept()]
    with pytest.raises(KeyboardInterrupt):
        with RunLog(sinks) as log:
            for entry in RECORDS:
                log.record(entry)
            raise KeyboardInterrupt
    assert all(s.entries == RECORDS and s.closed for s in sinks)


def test_only_rank_0_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    with open_run_log(tmp_path, tensorboard=True, first_step=1, config_yaml="name: run\n") as log:
        log.record(RECORDS[0])
    assert list(tmp_path.iterdir()) == []

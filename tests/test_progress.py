"""run's progress lines, without a model."""
from __future__ import annotations

import io

from llamabatch.cli.run.progress import RATE_WINDOW_S, PlainReporter, Snapshot


def test_progress_names_the_window_its_rate_is_measured_over():
    # jobs/batch_loop.py measures tok/s over the last RATE_WINDOW_S seconds; the line must not
    # pass that off as the run's average (it used to say "since the run started")
    out = io.StringIO()
    reporter = PlainReporter(out, every=0)
    reporter.update(Snapshot(done=3, total=10, failed=0, tok_s=12.34, active=2, n_parallel=4, eta_s=7))
    assert RATE_WINDOW_S == 5
    assert out.getvalue() == "llamabatch run: 3/10 lines, 12.3 tok/s (last 5 s), 2/4 slots busy, 0 failed, ETA 0:07\n"

"""The retrain rule: silent at the baseline's own rate, firing once a real drop fills its window; counters read from
a server's /metrics text, as llama-server and vLLM write it."""

import http.server
import math
import threading

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.evaluation.acceptance_monitor import (
    AcceptanceMonitor,
    RetrainRule,
    counter,
    ratio_standard_error,
    read_counters,
    watch,
)


def requests(rate: float, n: int, drafted: int = 40, swing: float = 0.1):
    """n requests at about `rate`, alternating above and below it by `swing` (request-to-request spread)."""
    return [(drafted, round(drafted * (rate + (swing if i % 2 else -swing)))) for i in range(n)]


def test_the_rule_stays_silent_at_the_baseline_and_fires_on_a_drop():
    rule = RetrainRule(baseline=0.6, tolerance=0.15, window=10, min_observations=4)
    steady = AcceptanceMonitor(rule)
    assert not any(steady.observe(d, a).retrain for d, a in requests(0.6, 40))
    assert steady.fired_at is None
    dropped = AcceptanceMonitor(rule)
    for d, a in requests(0.6, 10) + requests(0.3, 10):
        dropped.observe(d, a)
    assert dropped.fired_at is not None and 11 <= dropped.fired_at <= 20   # only after the drop came in


def test_a_drop_within_the_tolerance_does_not_fire():
    monitor = AcceptanceMonitor(RetrainRule(baseline=0.6, tolerance=0.15, window=10, min_observations=4))
    for d, a in requests(0.55, 30, swing=0.02):
        monitor.observe(d, a)
    assert monitor.fired_at is None


def test_nothing_fires_before_min_observations():
    monitor = AcceptanceMonitor(RetrainRule(baseline=0.9, window=10, min_observations=5))
    verdicts = [monitor.observe(*r) for r in requests(0.1, 5, swing=0.0)]
    assert [v.retrain for v in verdicts] == [False] * 4 + [True] and monitor.fired_at == 5


def test_requests_without_drafts_are_skipped_and_bad_counts_refused():
    monitor = AcceptanceMonitor(RetrainRule(baseline=0.5))
    assert monitor.observe(0, 0).rate is None and monitor.verdict().observations == 0
    with pytest.raises(DraftheadsError, match="accepted <= drafted"):
        monitor.observe(3, 4)


def test_ratio_standard_error_by_hand():
    obs = [(10, 5), (20, 14), (10, 3)]
    rate = 22 / 40
    residuals = [5 - rate * 10, 14 - rate * 20, 3 - rate * 10]
    expected = math.sqrt(sum(r * r for r in residuals) / 2 / 3) / (40 / 3)
    assert ratio_standard_error(obs, rate) == pytest.approx(expected)
    assert ratio_standard_error([(10, 5)], 0.5) == math.inf


@pytest.mark.parametrize("bad, match", [({"baseline": 0.0}, "baseline"), ({"baseline": 0.5, "tolerance": 1.0},
                                        "tolerance"), ({"baseline": 0.5, "window": 1}, "window")])
def test_bad_rules_are_one_line_errors(bad, match):
    with pytest.raises(DraftheadsError, match=match):
        RetrainRule(**bad)


LLAMA = """# HELP llamacpp:spec_decode_num_draft_tokens_total Total draft tokens
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 120
llamacpp:spec_decode_num_accepted_tokens_total 75
llamacpp:spec_decode_num_drafts_total 40
"""
VLLM = """vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 100.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 2.1e2
"""


def test_counters_are_read_from_llama_server_and_vllm_metrics():
    assert counter(LLAMA, "spec_decode_num_draft_tokens_total", "u") == 120
    assert counter(LLAMA, "spec_decode_num_accepted_tokens_total", "u") == 75
    assert counter(VLLM, "spec_decode_num_draft_tokens_total", "u") == 400
    assert counter(VLLM, "spec_decode_num_accepted_tokens_total", "u") == 210
    with pytest.raises(DraftheadsError, match="drafts nothing"):
        counter("llamacpp:n_decode_total 3\n", "spec_decode_num_draft_tokens_total", "u")


class Metrics(http.server.BaseHTTPRequestHandler):
    """Counters that grow by 40 drafted per poll, accepted at 0.6 for 6 polls, then at 0.2."""

    polls = 0

    def do_GET(self):
        cls = type(self)
        n = cls.polls
        accepted = sum(24 if i < 6 else 8 for i in range(n))
        body = (f"llamacpp:spec_decode_num_draft_tokens_total {40 * n}\n"
                f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}\n").encode()
        cls.polls += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_watch_polls_a_server_and_stops_when_the_rule_fires():
    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert read_counters(url) == (0, 0)
        Metrics.polls = 0
        lines = []
        monitor = watch(url, RetrainRule(baseline=0.6, window=4, min_observations=3), interval_s=0.01, polls=20,
                        stop_when_fired=True, progress=lines.append)
    finally:
        server.shutdown()
    assert monitor.fired_at is not None and monitor.fired_at > 6 and "RETRAIN" in lines[-1]
    with pytest.raises(DraftheadsError, match="cannot read"):
        read_counters(url)

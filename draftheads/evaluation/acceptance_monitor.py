"""Watching a served drafter's acceptance, and the rule that says when to retrain it.

    monitor = AcceptanceMonitor(RetrainRule(baseline=0.62))
    for drafted, accepted in counts:                 # per request, or per poll of a server's counters
        verdict = monitor.observe(drafted, accepted)
        if verdict.retrain: ...
    draftheads monitor http://127.0.0.1:8080 --baseline 0.62      # a live llama-server (or vLLM) /metrics
    monitor, rate = serve_monitored(engine, target_gguf, drafter_gguf, prompts, rule, log)   # one served run

The rule: over the last `window` observations (requests, or intervals between two polls), the acceptance rate
R = sum(accepted) / sum(drafted); retrain when even R's upper 95% bound is below baseline x (1 - tolerance). The bound
treats each observation as one draw of a ratio estimator (its standard error from how far each observation's
accepted count is from R x its drafted count), not each drafted token as an independent coin: the tokens of one
request are accepted together or not at all, and a token-level bound would fire on one unlucky request. The rule
waits for `min_observations` so a cold start does not fire, and fires on the baseline's own target only at the rate
its one-sided 5% allows per check, while a real drop past the tolerance fires once the window holds it.

Counters are read from the Prometheus text a server's /metrics serves: llama-server (started with --metrics)
names them `llamacpp:spec_decode_num_draft_tokens_total` and `..._accepted_tokens_total`, vLLM
`vllm:spec_decode_num_draft_tokens_total` and `..._accepted_tokens_total`; the suffix is matched, every label
summed.
"""

from __future__ import annotations

import math
import re
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.interop.llama_server import LlamaServer

DRAFTED = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"
Z_95 = 1.645   # one-sided


@dataclass
class RetrainRule:
    """When a served drafter should be retrained."""

    baseline: float = doc(0.0, "acceptance rate (accepted / drafted tokens) measured when the drafter was deployed")
    tolerance: float = doc(0.15, "relative drop that calls for retraining: fire below baseline x (1 - tolerance)")
    window: int = doc(20, "observations (requests or polls) the rate is taken over")
    min_observations: int = doc(8, "observations before the rule may fire")

    def __post_init__(self):
        check(0 < self.baseline <= 1, f"the baseline acceptance rate must be in (0, 1], got {self.baseline}")
        check(0 < self.tolerance < 1, f"the tolerance must be in (0, 1), got {self.tolerance}")
        check(self.window >= 2, f"the window must hold at least 2 observations, got {self.window}")
        check(1 <= self.min_observations <= self.window,
              f"min_observations must be in [1, window={self.window}], got {self.min_observations}")

    @property
    def threshold(self) -> float:
        return self.baseline * (1 - self.tolerance)


@dataclass(frozen=True)
class Verdict:
    observations: int
    rate: float | None
    upper: float | None
    retrain: bool

    def line(self, rule: RetrainRule) -> str:
        if self.rate is None:
            return f"{self.observations} observations, nothing drafted yet"
        state = "RETRAIN" if self.retrain else "ok"
        return (f"acceptance {self.rate:.3f} (95% upper {self.upper:.3f}) over {self.observations} observations; "
                f"threshold {rule.threshold:.3f} = {1 - rule.tolerance:.2f} x baseline {rule.baseline:.3f}: {state}")


class AcceptanceMonitor:
    def __init__(self, rule: RetrainRule):
        self.rule = rule
        self.recent: deque[tuple[int, int]] = deque(maxlen=rule.window)
        self.fired_at: int | None = None   # the observation (1-based) at which the rule first fired
        self.seen = 0

    def observe(self, drafted: int, accepted: int) -> Verdict:
        if drafted < 0 or not 0 <= accepted <= max(drafted, 0):
            raise DraftheadsError(f"acceptance counts must satisfy 0 <= accepted <= drafted, got {accepted} of "
                                  f"{drafted}")
        self.seen += 1
        if drafted:   # a request that drafted nothing says nothing about the drafter
            self.recent.append((drafted, accepted))
        verdict = self.verdict()
        if verdict.retrain and self.fired_at is None:
            self.fired_at = self.seen
        return verdict

    def verdict(self) -> Verdict:
        n = len(self.recent)
        drafted = sum(d for d, _ in self.recent)
        if not drafted:
            return Verdict(n, None, None, False)
        rate = sum(a for _, a in self.recent) / drafted
        upper = rate + Z_95 * ratio_standard_error(list(self.recent), rate)
        return Verdict(n, rate, upper, n >= self.rule.min_observations and upper < self.rule.threshold)


def ratio_standard_error(observations: list[tuple[int, int]], rate: float) -> float:
    """Standard error of sum(accepted) / sum(drafted) over observations taken as the sampled units."""
    n = len(observations)
    if n < 2:
        return math.inf
    mean_drafted = sum(d for d, _ in observations) / n
    spread = sum((a - rate * d) ** 2 for d, a in observations) / (n - 1)
    return math.sqrt(spread / n) / mean_drafted


def read_counters(url: str) -> tuple[int, int]:
    """(drafted, accepted) token counters from a server's /metrics (Prometheus text), summed over labels."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        raise DraftheadsError(f"cannot read {url}/metrics ({e}); is the server up, and started with --metrics "
                              "(llama-server)?") from None
    return counter(text, DRAFTED, url), counter(text, ACCEPTED, url)


def counter(text: str, suffix: str, url: str) -> int:
    pattern = re.compile(rf"^[\w:]*{suffix}(?:{{[^}}]*}})?\s+([0-9.eE+]+)\s*$", re.M)
    values = pattern.findall(text)
    if not values:
        raise DraftheadsError(f"{url}/metrics has no *{suffix} counter: the server drafts nothing (no drafter "
                              "loaded) or is not llama-server/vLLM")
    return int(sum(float(v) for v in values))


def watch(url: str, rule: RetrainRule, interval_s: float = 30.0, polls: int | None = None, stop_when_fired=False,
          progress=print) -> AcceptanceMonitor:
    """Poll `url`'s counters every interval_s seconds; each interval in which the server drafted is one
    observation. Stops after `polls` polls (None: never) or, with stop_when_fired, when the rule fires."""
    monitor = AcceptanceMonitor(rule)
    last = read_counters(url)
    done = 0
    while polls is None or done < polls:
        time.sleep(interval_s)
        now = read_counters(url)
        drafted, accepted = now[0] - last[0], now[1] - last[1]
        last, done = now, done + 1
        if drafted < 0:   # the server restarted: its counters began again
            continue
        if drafted == 0:
            continue
        verdict = monitor.observe(drafted, accepted)
        progress(f"draftheads monitor: {verdict.line(rule)}")
        if verdict.retrain and stop_when_fired:
            break
    return monitor


def serve_monitored(server_program, target_gguf, drafter_gguf, prompts: list[list[int]], rule: RetrainRule,
                    log, draft_tokens: int = 3, max_new_tokens: int = 64) -> tuple[AcceptanceMonitor, float]:
    """llama-server with the EAGLE-3 drafter `drafter_gguf` on `target_gguf` answers the prompts (token ids) one by
    one; after each request its /metrics counters are read and the interval fed to the monitor, as `watch` does for
    a server in production. Returns the monitor and the whole run's acceptance rate."""
    monitor = AcceptanceMonitor(rule)
    args = ["-md", str(drafter_gguf), "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(draft_tokens),
            "--metrics"]
    with LlamaServer(server_program, target_gguf, args, log) as server:
        first = last = read_counters(server.url)
        for prompt in prompts:
            reply = server.complete(prompt, max_new_tokens)
            now = read_counters(server.url)
            if (now[0] - last[0], now[1] - last[1]) != (reply.drafted, reply.accepted):
                raise DraftheadsError(f"llama-server's /metrics counted {now[0] - last[0]} drafted, "
                                      f"{now[1] - last[1]} accepted for a request it reported as {reply.drafted}, "
                                      f"{reply.accepted}; its log: {log}")
            monitor.observe(now[0] - last[0], now[1] - last[1])
            last = now
    drafted = last[0] - first[0]
    return monitor, (last[1] - first[1]) / drafted if drafted else 0.0

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
summed. What a server sends is checked, not trusted: the first poll must read cleanly (a wrong address or a broken
exporter stops the monitor in one line), a later poll that reads nothing usable (the server unreachable, a counter
that is not a number, not finite, negative) is skipped with a note, said once per kind, and two in a row stop it.
Counters that went back mean the server restarted: the interval counts what it counted since, as Prometheus' rate()
takes a counter reset.
"""

from __future__ import annotations

import http.client
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.interop.llama_server import LlamaServer

DRAFTED = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"
Z_95 = 1.645   # one-sided
# A float64 counter counts whole tokens exactly only below 2^53: past it the difference of two polls means nothing.
MAX_COUNT = 2.0 ** 53
# One bad scrape (a restart, a proxy's error page) is skipped; a second in a row means the server keeps sending it,
# and a monitor that silently measures nothing is worse than one that stops.
BAD_POLLS_IN_A_ROW = 2
MAX_INTERVAL_S = 86400.0   # time.sleep overflows on huge values; a day between polls watches nothing
FIX_METRICS = "fix the server's metrics, or watch another server"


@dataclass
class RetrainRule:
    """When a served drafter should be retrained."""

    baseline: float = doc(0.0, "acceptance rate (accepted / drafted tokens) measured when the drafter was deployed",
                          flag="--baseline", required=True)
    tolerance: float = doc(0.15, "relative drop that calls for retraining: fire below baseline x (1 - tolerance)",
                           flag="--tolerance")
    window: int = doc(20, "observations (requests or polls) the rate is taken over", flag="--window")
    min_observations: int | None = doc(None, "observations before the rule may fire (default: 8, or the window when "
                                             "smaller)")

    def __post_init__(self):
        # comparisons that NaN fails: a NaN or infinite flag is refused here too
        check(0 < self.baseline <= 1, f"the baseline acceptance rate must be in (0, 1] (--baseline), got "
                                      f"{self.baseline}; give the rate measured at deployment, e.g. 0.62")
        check(0 < self.tolerance < 1, f"the tolerance must be in (0, 1) (--tolerance), got {self.tolerance}; e.g. 0.15 "
                                      "fires 15% below the baseline")
        check(self.window >= 2, f"the window must hold at least 2 observations (--window), got {self.window}; e.g. 20")
        if self.min_observations is None:
            self.min_observations = min(8, self.window)
        check(1 <= self.min_observations <= self.window,
              f"min_observations must be in [1, window={self.window}], got {self.min_observations}")

    @property
    def threshold(self) -> float:
        return self.baseline * (1 - self.tolerance)


@dataclass
class MonitorConfig:
    """How `draftheads monitor` polls a server."""

    interval: float = doc(30.0, "seconds between polls", flag="--interval")
    polls: int | None = doc(None, "stop after this many polls (None: never)", flag="--polls")

    def __post_init__(self):
        check(0 <= self.interval <= MAX_INTERVAL_S,   # NaN fails it too
              f"the monitor's --interval must be seconds in [0, {MAX_INTERVAL_S:.0f}], got {self.interval}; e.g. "
              "--interval 30")
        check(self.polls is None or self.polls >= 1, f"the monitor's --polls must be a whole number >= 1, got "
                                                     f"{self.polls}; leave it out to poll until stopped")


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


class BadPoll(DraftheadsError):
    """A poll that read nothing usable: the server unreachable, or a counter that holds no count. `kind` groups the
    notes (each said once); `problem` is what was read, the message adds what to do."""

    def __init__(self, kind: str, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.kind, self.problem = kind, problem


class Notes:
    """Notes on stderr, each kind once per run: a bad counter every 30 s would otherwise flood the log."""

    def __init__(self, write=lambda line: print(line, file=sys.stderr, flush=True)):
        self.write, self.said = write, set()

    def __call__(self, kind: str, text: str) -> None:
        if kind not in self.said:
            self.said.add(kind)
            self.write(f"note: {text}")


def metrics_url(url: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:   # 'http://[::1': an unclosed IPv6 address
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise DraftheadsError(f"'{url}' is not a server's address; give it as http://HOST:PORT, e.g. "
                              "http://127.0.0.1:8080")
    return url.rstrip("/") + "/metrics"


def read_metrics(url: str, notes: Notes) -> str:
    """The text of `url`'s /metrics; bytes that are not UTF-8 are replaced (noted), so only a counter they fall in
    is lost."""
    where = metrics_url(url)
    try:
        with urllib.request.urlopen(where, timeout=10) as response:
            body = response.read()
    except (OSError, http.client.HTTPException, ValueError) as e:   # URLError, refused, reset, cut short, bad port
        raise BadPoll("unreachable", f"cannot read {where} ({e})", "is the server up, and started with --metrics "
                      "(llama-server)?") from None
    try:
        return body.decode()
    except UnicodeDecodeError as e:
        notes("not utf-8", f"{where} is not UTF-8 text (byte {body[e.start]:#04x} at {e.start}); read with such "
                           "bytes replaced, a counter they fall in makes its poll unusable")
        return body.decode(errors="replace")


def read_counters(url: str, notes: Notes | None = None) -> tuple[int, int]:
    """(drafted, accepted) token counters from a server's /metrics (Prometheus text), summed over labels."""
    text = read_metrics(url, notes or Notes())
    return counter(text, DRAFTED, url), counter(text, ACCEPTED, url)


def counter(text: str, suffix: str, url: str) -> int:
    # name{labels} value [timestamp]; [ \t] so that a sample never runs on into the next line
    pattern = re.compile(rf"^([\w:]*{suffix})(?:{{[^}}\n]*}})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*$", re.M)
    samples = pattern.findall(text)
    if not samples:
        raise DraftheadsError(f"{url}/metrics has no *{suffix} counter: the server drafts nothing (no drafter "
                              "loaded) or is not llama-server/vLLM")
    total = sum(sample_value(name, value, url) for name, value in samples)
    if total >= MAX_COUNT:
        raise BadPoll("not a count", f"{url}/metrics: *{suffix} sums to {total:.4g}, not a count of tokens",
                      FIX_METRICS)
    return int(total)


def sample_value(name: str, value: str, url: str) -> float:
    """One sample's value: a finite count of tokens, or a BadPoll."""
    try:
        number = float(value)
    except ValueError:
        raise BadPoll("not a number", f"{url}/metrics: {name} is {value!r}, not a number", FIX_METRICS) from None
    if not 0 <= number < MAX_COUNT:   # NaN, +-Inf, negative, past float64's whole numbers
        raise BadPoll("not a count", f"{url}/metrics: {name} is {value}, not a count of tokens (0 to 2^53)",
                      FIX_METRICS)
    return number


def interval_counts(last: tuple[int, int], now: tuple[int, int], notes: Notes) -> tuple[int, int] | None:
    """(drafted, accepted) between two polls, None when they cannot be told (noted). Counters that went back mean
    the server restarted: what they hold now is what it counted since."""
    drafted, accepted = now[0] - last[0], now[1] - last[1]
    if drafted < 0 or accepted < 0:
        notes("restart", f"the counters went back ({last[0]} -> {now[0]} drafted): the server restarted; this "
                         "interval counts what it drafted since")
        drafted, accepted = now
    if accepted > drafted:
        notes("inconsistent", f"an interval counted {accepted} accepted of {drafted} drafted tokens; such intervals "
                              "are skipped")
        return None
    return drafted, accepted


def watch(url: str, rule: RetrainRule, interval_s: float = 30.0, polls: int | None = None, stop_when_fired=False,
          progress=print, notes: Notes | None = None) -> AcceptanceMonitor:
    """Poll `url`'s counters every interval_s seconds; each interval in which the server drafted is one
    observation. Stops after `polls` polls (None: never) or, with stop_when_fired, when the rule fires."""
    MonitorConfig(interval=interval_s, polls=polls)   # the checks --interval and --polls go through
    notes = notes or Notes()
    monitor = AcceptanceMonitor(rule)
    last = read_counters(url, notes)   # the first poll must read cleanly: a wrong address stops here, in one line
    done = bad = 0
    while polls is None or done < polls:
        time.sleep(interval_s)
        done += 1
        try:
            now = read_counters(url, notes)
        except BadPoll as e:
            bad = skip_or_stop(e, bad + 1, notes)
            continue
        last, counts, bad = now, interval_counts(last, now, notes), 0
        if counts is None or counts[0] == 0:   # nothing drafted: says nothing about the drafter
            continue
        verdict = monitor.observe(*counts)
        progress(f"draftheads monitor: {verdict.line(rule)}")
        if verdict.retrain and stop_when_fired:
            break
    return monitor


def skip_or_stop(bad_poll: BadPoll, in_a_row: int, notes: Notes) -> int:
    """A poll that read nothing usable is skipped with a note; BAD_POLLS_IN_A_ROW of them stop the monitor."""
    if in_a_row >= BAD_POLLS_IN_A_ROW:
        raise DraftheadsError(f"{in_a_row} polls in a row read nothing usable, the last: {bad_poll}") from None
    notes(bad_poll.kind, f"{bad_poll.problem}; the poll is skipped")
    return in_a_row


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

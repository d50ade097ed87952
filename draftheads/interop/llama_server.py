"""One llama.cpp server process, driven over HTTP on the loopback: what the in-engine evaluation runs.

    with LlamaServer(engine, target_gguf, ["-md", "drafter.gguf", "--spec-type", "draft-eagle3"]) as server:
        reply = server.complete(prompt_ids, max_new_tokens=128)   # greedy; the engine's own timings and draft counts

Prompts go in as token ids (rendered here with the target's chat template, as our own loop renders them), so the
engine and our loop read the same tokens. Each request runs alone (one slot, no prompt cache), greedy, and stops at
the target's end-of-generation tokens or after `max_new_tokens`. With `slots=N` the server answers N requests side
by side, each slot with `context` tokens: what `draftheads data` asks of it (`data.backend: openai`, at
`server.url + "/v1"`). The server's log is kept in a file; a server that exits or never answers is a one-line error
quoting its log's last lines.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from draftheads.core.errors import DraftheadsError

START_TIMEOUT_S = 180
REQUEST_TIMEOUT_S = 600


@dataclass
class Reply:
    """One completion as the engine reports it (its own timings, in seconds; its speculative counts)."""

    tokens: list[int]
    prompt_s: float
    decode_s: float
    prompt_tokens: int
    drafted: int
    accepted: int

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def total_s(self) -> float:
        return self.prompt_s + self.decode_s

    @property
    def target_passes(self) -> int:
        """Target forwards after the prompt's: each yields its accepted drafts plus one token, and the prompt's own
        forward yields the first token."""
        return max(0, self.new_tokens - 1 - self.accepted)


class LlamaServer:
    """`llama-server` for `target` (a GGUF file) with extra arguments (a drafter, a speculative mode)."""

    def __init__(self, server: Path, target: Path, args: list[str], log: Path, threads: int | None = None,
                 context: int = 4096, slots: int = 1):
        if slots < 1:
            raise DraftheadsError(f"llama-server needs at least one slot, got {slots}")
        self.command = [str(server), "-m", str(target), "--host", "127.0.0.1", "--port", str(free_port()),
                        "-t", str(threads or os.cpu_count() or 1), "-c", str(context * slots), "-np", str(slots),
                        "--no-webui", "--no-warmup", *args]
        self.url = f"http://127.0.0.1:{self.command[self.command.index('--port') + 1]}"
        self.context = context
        self.log = Path(log)
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DraftheadsError(f"llama-server exited at start ({self.last_lines()}); its log: {self.log}")
            try:
                if json.loads(self._get("/health")).get("status") == "ok":
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            time.sleep(0.2)
        self.stop()
        raise DraftheadsError(f"llama-server did not become ready in {START_TIMEOUT_S} s ({self.last_lines()}); its "
                              f"log: {self.log}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def complete(self, prompt: list[int], max_new_tokens: int) -> Reply:
        """Greedy completion of the token ids `prompt`."""
        body = {"prompt": prompt, "n_predict": max_new_tokens, "temperature": 0.0, "cache_prompt": False,
                "return_tokens": True, "stream": False}
        request = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                answer = json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise DraftheadsError(f"llama-server did not answer ({e}; {self.last_lines()}); its log: "
                                  f"{self.log}") from None
        t = answer["timings"]
        return Reply(list(answer.get("tokens") or []), t["prompt_ms"] / 1000, t["predicted_ms"] / 1000,
                     int(t["prompt_n"]), int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)))

    def _get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return response.read().decode()

    def last_lines(self, n: int = 2) -> str:
        try:
            lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no log"
        return " | ".join(lines[-n:])[-300:] or "no output"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

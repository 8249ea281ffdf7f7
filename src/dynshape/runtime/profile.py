"""Which dispatch keys a served model sees, counted on the request path, and when one becomes hot.

A key is *hot* when it has been called at least `min_calls` times in the current window of calls and makes up
at least `min_share` of the last `window` calls (defaults 20, 5%, 1,000: a shape seen once a minute never earns
a build, a shape that is one call in twenty does).  The sliding window is approximated the usual cheap way:
counts per fixed window of `window` calls, the previous window's weighted by how much of it the sliding window
still covers.  So `observe` is two dict operations and a comparison, with no lock and no ring of keys.
Concurrent callers can lose an increment; hotness is a heuristic for where to spend builds, not an accounting.

Profiles are JSON: the symbol names and the observed key counts, by name, so a profile written by one
deployment prebuilds the variants of the next (`Executable.save_profile`, `ds.compile(..., profile=path)`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dynshape.errors import DynshapeError

FORMAT = "dynshape-profile-1"
WINDOW_KEYS = 256  # distinct keys counted per window (see KeyProfile)
MAX_KEYS = 1024  # distinct keys remembered across windows; beyond it the least-called half is forgotten


class KeyProfile:
    """Key counts since start-up, and per window of calls: the current window's and the previous one's.

    Bounded memory. A window counts at most WINDOW_KEYS distinct keys (a key first seen after that is counted
    from the next window on) and at most MAX_KEYS keys are remembered across windows. Why: a server whose shapes
    rarely repeat (random text widths) made every call a new key, and the profile held them all, up to 65,536
    (~10 MB): byte_cls's resident memory grew by ~0.2 MB per 1,000 calls, forever, from the profile alone
    (tracemalloc; bench/cnn_bench.py --memory). A key hot enough to earn a variant (5% of a window's calls by
    default) is among a window's first 256 distinct keys unless 256 others come first, and only the most-called
    keys of a saved profile can pass its thresholds (`hot_in_total`), so neither cap changes what gets built
    beyond a window's delay on an adversarial stream.
    """

    def __init__(self, min_calls: int = 20, min_share: float = 0.05, window: int = 1000):
        self.min_calls, self.min_share, self.window = min_calls, min_share, window
        self.calls = 0
        self._done: dict[tuple, int] = {}  # counts of the finished windows
        self._cur: dict[tuple, int] = {}  # counts of the current window
        self._prev: dict[tuple, int] = {}  # counts of the window before
        self._roll_at = window

    def observe(self, key: tuple) -> bool:
        """Count one call; True when the key has `min_calls` calls in the current window: a candidate, which
        `is_hot` then examines (keys that already have a variant need not be).  A key hot across a window
        boundary is found a few calls into the next window."""
        cur = self._cur
        c = cur.get(key, 0) + 1
        if c > 1 or len(cur) < WINDOW_KEYS:
            cur[key] = c
        else:
            c = 0  # the window's distinct keys are counted: this one from the next window on
        self.calls += 1
        if self.calls >= self._roll_at:
            self._roll()
        return c >= self.min_calls

    def is_hot(self, key: tuple) -> bool:
        return self._cur.get(key, 0) >= self.min_calls and self.share(key) >= self.min_share

    def count(self, key: tuple) -> int:
        """Calls of the key since start-up."""
        return self._done.get(key, 0) + self._cur.get(key, 0)

    def _roll(self) -> None:
        self._roll_at = self.calls + self.window
        done = self._done
        for k, c in self._cur.items():
            done[k] = done.get(k, 0) + c
        self._prev, self._cur = self._cur, {}
        if len(done) > MAX_KEYS:
            self._done = dict(sorted(done.items(), key=lambda kv: -kv[1])[: MAX_KEYS // 2])

    def recent(self, key: tuple) -> float:
        """Calls of the key among the last `window` calls: the current window's plus the previous window's,
        scaled by the part of it still inside the sliding window."""
        elapsed = 1.0 - (self._roll_at - self.calls) / self.window
        return self._cur.get(key, 0) + self._prev.get(key, 0) * (1.0 - elapsed)

    def share(self, key: tuple) -> float:
        """Fraction of the last `window` calls (or of all calls, while fewer) that had this key."""
        return self.recent(key) / max(1, min(self.calls, self.window))

    @property
    def counts(self) -> dict[tuple, int]:
        """Calls per key since start-up (a copy)."""
        out = dict(self._done)
        for k, c in list(self._cur.items()):
            out[k] = out.get(k, 0) + c
        return out

    def hot_in_total(self, counts: dict[tuple, int]) -> list[tuple]:
        """Keys of a saved profile that pass the same thresholds over the whole profile, most called first."""
        total = sum(counts.values())
        return [k for k, n in sorted(counts.items(), key=lambda kv: -kv[1])
                if n >= self.min_calls and n >= self.min_share * total]


def save(path: str | os.PathLike, names: list[str], counts: dict[tuple, int]) -> None:
    """Write key counts as JSON: `{"format", "symbols": [...], "calls", "keys": [{name: value, ..., "count"}]}`."""
    keys = [{**dict(zip(names, k)), "count": n} for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    data = {"format": FORMAT, "symbols": names, "calls": sum(counts.values()), "keys": keys}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def load(path: str | os.PathLike, names: list[str]) -> dict[tuple, int]:
    """Key counts of a saved profile, as keys in `names` order; a profile of other symbols is refused."""
    try:
        data = json.loads(Path(path).read_text())
        saved = list(data["symbols"])
        rows = data["keys"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DynshapeError(f"profile {path}: cannot read it ({type(e).__name__}: {e}); write one with "
                            "exe.save_profile(path)") from None
    if data.get("format") != FORMAT:
        raise DynshapeError(f"profile {path}: format {data.get('format')!r}, expected {FORMAT!r}")
    if sorted(saved) != sorted(names):
        raise DynshapeError(f"profile {path} counts shapes of symbols {saved}, this model's symbols are {names}: "
                            "it was recorded for another model or other dims")
    counts: dict[tuple, int] = {}
    for row in rows:
        try:
            key = tuple(int(row[n]) for n in names)
            counts[key] = counts.get(key, 0) + int(row["count"])
        except (KeyError, TypeError, ValueError):
            raise DynshapeError(f"profile {path}: malformed entry {row!r}") from None
    return counts

"""Stop sequences (OpenAI `stop`): end the answer's text at the first occurrence of any.

`StopFilter.feed(text)` returns the text that is certainly not part of a stop sequence and
holds back a tail that could still become one, so a streamed answer never shows a stop
sequence (or half of one). The matched sequence itself is dropped, as OpenAI does.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_STOPS = 4  # OpenAI's limit


def check_stops(stop: str | Iterable[str] | None) -> tuple[str, ...]:
    """`stop` as a tuple of non-empty strings (at most 4); ValueError naming the rule."""
    from ..errors import InvalidOptionError

    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    try:
        items = list(items)
    except TypeError:
        raise InvalidOptionError(f"stop must be a string or a list of up to {MAX_STOPS} "
                                 f"strings, got {stop!r}") from None
    if len(items) > MAX_STOPS or not all(isinstance(s, str) and s for s in items):
        raise InvalidOptionError(f"stop must be a string or a list of up to {MAX_STOPS} "
                                 f"non-empty strings, got {stop!r}")
    return tuple(items)


class StopFilter:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.held = ""
        self.hit: str | None = None  # the stop sequence found, once found

    def feed(self, text: str) -> str:
        if self.hit is not None:
            return ""
        buffer = self.held + text
        found = [(buffer.find(s), s) for s in self.stops if s in buffer]
        if found:
            index, self.hit = min(found)
            self.held = ""
            return buffer[:index]
        keep = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(buffer)), keep, -1):
                if buffer.endswith(stop[:size]):
                    keep = size
                    break
        self.held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The held tail, when the text ends (or leaves the answer) without a stop."""
        out, self.held = self.held, ""
        return out

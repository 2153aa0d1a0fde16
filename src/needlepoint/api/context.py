"""The context window: the one rule for what fits (`check_fits`, of `Needle` and the server
alike), and keeping a long chat inside it: drop the oldest exchanges, replay the rest.

A `Needle` conversation is one KV cache. When the next user turn (plus room to answer) no
longer fits the model's context, the conversation is rebuilt on a fresh session from the
most recent turns that do fit: the first kept user turn becomes the first prompt (system
facts, the same offered tools, that text), then each kept answer exactly as it was generated
(its tokens), `<|im_end|>`, and the next user turn, in the usual multi-turn format. The
caller reports how many turns were dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import ContextLengthError
from ..formats.chat_format import NeedleFormat
from .chat import Exchange

MIN_ANSWER_ROOM = 32  # context kept free for the answer: min(max_new_tokens, this or 1/8)

def answer_room(context: int, max_new_tokens: int) -> int:
    """Tokens a new turn needs free after its prompt before it counts as fitting."""
    return min(max_new_tokens, max(MIN_ANSWER_ROOM, context // 8))


def check_fits(tokens: int, limit: int | None, first_turn: bool,
               max_new_tokens: int | None = None) -> None:
    """The one context rule, of `Needle` and the server alike: a turn's input (`tokens` in
    the conversation once it is fed) leaves room for at least one answer token in the
    model's context of `limit` tokens, and for all of `max_new_tokens` when a caller asks for
    that budget to fit (the server's explicit `max_tokens`); ContextLengthError saying what to
    do otherwise."""
    if limit is None or (tokens < limit and (max_new_tokens is None or
                                             tokens + max_new_tokens <= limit)):
        return
    fix = ("shorten the query or the tool schemas (descriptions count), or offer fewer tools"
           if first_turn else "shorten the message, or start a new conversation (reset)")
    asked = "" if max_new_tokens is None else f" plus the {max_new_tokens} asked for"
    raise ContextLengthError(f"the prompt is {tokens} tokens{asked} but this model reads at "
                             f"most {limit} in all (max_seq_len), the answer included: {fix}",
                             prompt_tokens=tokens, limit=limit, max_new_tokens=max_new_tokens)


def replay_ids(first_prompt: Callable[[str], list[int]], chat_format: NeedleFormat,
               kept: Sequence[Exchange], user: str) -> list[int]:
    """Token ids of a conversation of the `kept` turns followed by the user turn `user`."""
    users = [exchange.user for exchange in kept] + [user]
    ids = list(first_prompt(users[0]))
    for exchange, following in zip(kept, users[1:], strict=True):
        ids += chat_format.next_turn_ids(exchange.answer, following)
    return ids


def fitting_replay(first_prompt: Callable[[str], list[int]], chat_format: NeedleFormat,
                   history: Sequence[Exchange], user: str, limit: int, room: int
                   ) -> tuple[int, list[int]]:
    """(turns dropped, ids) for the fewest oldest turns dropped so that the rebuilt prompt
    leaves `room` tokens free; every earlier turn dropped if even that does not fit."""
    for dropped in range(1, len(history) + 1):
        ids = replay_ids(first_prompt, chat_format, history[dropped:], user)
        if len(ids) + room <= limit or dropped == len(history):
            return dropped, ids
    return 0, replay_ids(first_prompt, chat_format, history, user)

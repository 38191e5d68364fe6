"""The prompt size the proxy acts on: estimated, counted exactly near a decision, calibrated.

Every turn the compaction stage has a per-message estimate of the history (characters / 4,
plus images and documents: proxy/tokens/parts), kept incrementally per session. That is cheap
and good enough far from any decision. Near one — once the calibrated estimate reaches NEAR of
the compaction trigger — the messages are counted with the model's own tokenizer
(proxy/tokens/tokenizers), each once: a session's counts carry over turn to turn with its
history, and a text counted before (in any session) is found by its hash. From then on the
session's new messages are counted as they come.

Whatever is counted, the provider may count differently (its tokenizer, the way it frames
messages and tool schemas, what the proxy does not see). So after each call the provider's
reported prompt tokens are compared with the proxy's count of that very request, and the ratio
is kept per scoped session and model: the next turn's count is multiplied by it. A trigger then
lands where it should for any tokenizer, from the second turn of a session on.

A ratio applies only to a measure in the units it was learnt in. One learnt against counts
keeps how many counted tokens the session's text makes per estimated token: when the counts
are lost (the client edited an early message, so its history no longer matches), the
estimate is read through both, and is as far from the limit as the counts would be (code
counts about twice its estimate). Near the limit it is then counted again. Counts, too,
are in their tokenizer's units: a fallback to a model of another tokenizer counts the
history again rather than take the first model's counts as its own.

Bounded by bytes: ratios for the most recent sessions, counts for the most recent texts.
Per process: replicas each learn a session's ratio from the turns they serve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import xxhash
from cachetools import LRUCache

from proxy.exchange import Exchange, PromptMeasure, Usage
from proxy.messages import (
    TOKENS_PER_MESSAGE,
    Message,
    estimate_tokens,
    non_text_tokens,
    text_of,
)
from proxy.tokens.tokenizers import Tokenizer, Tokenizers, family

NEAR = 0.7  # exact counting starts at this share of the decision's limit
THREAD_CHARS = 64 * 1024  # more text than this counted at once is counted in a thread
MEMO_MIN_CHARS = 256  # shorter texts are counted again rather than remembered
RATIO_BYTES, COUNT_BYTES = 400, 200  # an entry's memory, about
RATIO_BOUNDS = (0.2, 5.0)  # a report outside this is a mismatch (not the same request): ignored


class Measured(Protocol):
    """A session's history as the compaction stage keeps it (compaction/memo.Seen)."""

    messages: list[Message]
    costs: list[int]  # per message, in the measure's units
    exact: int  # how many leading costs are exact counts
    estimated: int  # what those were estimated at before they were counted
    counted_by: str  # the tokenizer that counted them


@dataclass(frozen=True, slots=True)
class Ratio:
    value: float  # provider tokens per measured token of text (framing aside)
    exact: bool  # learned against exact counts (else against estimates)
    density: float = 1.0  # exact: the session's counted tokens per estimated token of text

    def for_estimates(self) -> float:
        """Provider tokens per estimated token of text: the ratio for a measure that is (or
        fell back to) the estimate."""
        return self.value * self.density if self.exact else self.value


@dataclass(frozen=True, slots=True)
class Measure:
    fixed: int  # tool schemas
    total: int  # fixed and every message, in the measure's units
    factor: float  # provider tokens per unit: the calibration


class PromptMeter:
    def __init__(
        self,
        tokenizers: Tokenizers | None = None,
        ratios_bytes: int = 8 * 1024 * 1024,
        counts_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.tokenizers = tokenizers or Tokenizers()
        # Bounded by bytes, each entry costed at about what it holds (a session key, a float;
        # a hash and an int).
        self._ratios: LRUCache[tuple[str, str], Ratio] = LRUCache(
            ratios_bytes, getsizeof=lambda ratio: RATIO_BYTES
        )
        self._counts: LRUCache[tuple[str, int], int] = LRUCache(
            counts_bytes, getsizeof=lambda count: COUNT_BYTES
        )

    def memos(self) -> dict[str, LRUCache[Any, Any]]:
        return {"token_ratios": self._ratios, "token_counts": self._counts}

    def by_session(self) -> list[LRUCache[Any, Any]]:
        """The memos keyed by (session, ...): an idle session's entries go with it."""
        return [self._ratios]

    def ratio(self, session: str, model: str) -> Ratio | None:
        return self._ratios.get((session, model))

    async def measure(self, ex: Exchange, seen: Measured, fixed: int, limit: int) -> Measure:
        """This request's prompt, with `fixed` (the tool schemas' estimate) and `limit` (the
        decision's, in provider tokens). Near the limit, counts `seen` exactly in place."""
        model = ex.deployment.model if ex.deployment is not None else ""
        ratio = self.ratio(ex.identity.session, model)
        messages = len(seen.messages)
        estimate = fixed + sum(seen.costs)
        # Learnt against counts, and the counts lost with an edit: in the estimate's units.
        value = ratio.for_estimates() if ratio is not None else 1.0
        measured = PromptMeasure(model, estimate, messages, value)
        if seen.exact or measured.estimate >= NEAR * limit:
            tokenizer = await self.tokenizers.get(model)  # None: none could be loaded
            if tokenizer is not None:
                await self._count_exactly(tokenizer, seen)
                estimated = fixed + seen.estimated  # the same messages and schemas, estimated
                fixed = await self._schema_tokens(tokenizer, ex.body.get("tools"))
                value = ratio.value if ratio is not None else 1.0
                exact = PromptMeasure(model, fixed + sum(seen.costs), messages, value, True)
                estimated -= min(estimated, exact.framing)
                exact.density = (exact.total - exact.framing) / max(1, estimated)
                if ratio is not None and not ratio.exact:
                    # Learned against estimates. The model's own tokenizer needs none; a
                    # borrowed one starts from the same calibrated figure, in its units.
                    text = max(1, exact.total - exact.framing)
                    carried = (measured.estimate - measured.framing) / text
                    exact.ratio = 1.0 if family(model)[1] else carried
                measured = exact
        ex.prompt = measured
        return Measure(fixed, measured.total, measured.factor)

    async def _count_exactly(self, tokenizer: Tokenizer, seen: Measured) -> None:
        start = seen.exact
        if start and seen.counted_by != tokenizer.name:  # another model's (a fallback's)
            seen.costs[:start] = map(estimate_tokens, seen.messages[:start])
            start = seen.exact = seen.estimated = 0
        seen.counted_by = tokenizer.name
        if start >= len(seen.messages):
            return
        fresh = seen.messages[start:]
        counts = await self.count(tokenizer, [text_of(m) for m in fresh])
        seen.estimated += sum(seen.costs[start:])  # still the estimates: overwritten next
        for offset, (message, tokens) in enumerate(zip(fresh, counts, strict=True)):
            seen.costs[start + offset] = TOKENS_PER_MESSAGE + tokens + non_text_tokens(message)
        seen.exact = len(seen.messages)

    async def _schema_tokens(self, tokenizer: Tokenizer, tools: Any) -> int:
        if not isinstance(tools, list) or not tools:
            return 0
        (tokens,) = await self.count(tokenizer, [orjson.dumps(tools).decode()])
        return tokens

    async def count(self, tokenizer: Tokenizer, texts: Sequence[str]) -> list[int]:
        """Exact counts of `texts`; long ones remembered by hash, a large batch in a thread
        (the tokenizers release the GIL), the memo touched on the event loop only."""
        counts: list[int | None] = [None] * len(texts)
        missing: list[int] = []
        for i, text in enumerate(texts):
            if len(text) >= MEMO_MIN_CHARS:
                counts[i] = self._counts.get((tokenizer.name, _hash(text)))
            if counts[i] is None:
                missing.append(i)
        batch = [texts[i] for i in missing]
        if sum(map(len, batch)) > THREAD_CHARS:
            fresh = await asyncio.to_thread(lambda: [tokenizer.count(t) for t in batch])
        else:
            fresh = [tokenizer.count(t) for t in batch]
        for i, tokens in zip(missing, fresh, strict=True):
            counts[i] = tokens
            if len(texts[i]) >= MEMO_MIN_CHARS:
                self._counts[(tokenizer.name, _hash(texts[i]))] = tokens
        return [c or 0 for c in counts]

    def learn(self, ex: Exchange, usage: Usage | None) -> None:
        """After the call: the provider's count of the very request measured, if there was
        exactly one reported call and it went to the model the measure was for. What the
        calibration keeps is the ratio of the text (and tool schemas): the few tokens framing
        each message are the same in both counts, whatever the tokenizer."""
        measured = ex.prompt
        if (
            measured is None
            or usage is None
            or ex.accounting.usage_reports != 1
            or ex.accounting.usage_estimated
        ):
            return
        if ex.deployment is None or ex.deployment.model != measured.model:
            return
        text = measured.total - measured.framing
        if text <= 0 or usage.prompt_tokens <= measured.framing:
            return
        value = (usage.prompt_tokens - measured.framing) / text
        low, high = RATIO_BOUNDS
        if low <= value <= high:
            self._ratios[(ex.identity.session, measured.model)] = Ratio(
                value, measured.exact, measured.density
            )

    async def close(self) -> None:
        await self.tokenizers.close()


def _hash(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))

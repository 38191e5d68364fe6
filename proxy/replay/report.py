"""What a replay prints: a table call by call and the totals (rich), or one JSON object. A
row is a model call (`call`, and the client turn it belongs to, `turn`); the totals count
both: `turns` (client turns: a person's prompts) and `calls`, as the sessions list does."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from proxy.replay.engine import TurnRow

JSON = dict[str, Any]
UNKNOWN = "\N{EN DASH}"  # a cost an unpriced model leaves unknown: never $0, as the inspector shows
_NUMBERS = ("call", "turn", "received", "sent", "cache hit", "cost")  # right-aligned columns
Against = tuple[str, Sequence[TurnRow], int | None]  # the policy, its rows, the first difference


@dataclass(frozen=True)
class Replayed:
    """One trace (or session) replayed: its rows, and with --against the second policy's."""

    source: str
    policy: str | None
    rows: Sequence[TurnRow]
    against: Against | None = None


def as_json_all(replays: Sequence[Replayed]) -> JSON:
    """One replay's object; several: each one's under `replays`, and the totals of all
    (`against_totals` with --against)."""
    if len(replays) == 1:
        one = replays[0]
        return as_json(one.source, one.policy, one.rows, one.against)
    out: JSON = {
        "replays": [as_json(r.source, r.policy, r.rows, r.against) for r in replays],
        "totals": totals([row for r in replays for row in r.rows]),
    }
    if replays[0].against is not None:
        out["against_totals"] = totals([row for r in replays if r.against for row in r.against[1]])
    return out


def print_all(console: Console, replays: Sequence[Replayed]) -> None:
    """Each replay's report; several: then their totals."""
    for one in replays:
        print_text(console, one.source, one.rows, one.against)
    if len(replays) == 1:
        return
    console.print(f"total of {len(replays)} traces:", highlight=False, markup=False)
    _print_totals(console, _policy_of([r.rows for r in replays]), [
        row for r in replays for row in r.rows])  # fmt: skip
    if replays[0].against is not None:
        others = [r.against[1] for r in replays if r.against]
        _print_totals(console, _policy_of(others), [row for rows in others for row in rows])


def _policy_of(runs: Sequence[Sequence[TurnRow]]) -> str:
    """The policy the rows were replayed with ("several" when a trace's selection differed)."""
    names = {row.policy for rows in runs for row in rows[:1]}
    return names.pop() if len(names) == 1 else "several"


def totals(rows: Sequence[TurnRow]) -> JSON:
    """The sums; `turns` counts the calls that open a client turn (each trace's first does),
    so several traces' rows add up as their own totals do."""
    sent = sum(r.tokens_sent for r in rows)
    read = sum(r.cache_read_tokens for r in rows)
    costs = [r.cost_usd for r in rows if r.cost_usd is not None]
    rewrites = Counter(f"{w['stage']}.{w['action']}" for r in rows for w in r.rewrites)
    return {
        "turns": sum(r.opens for r in rows),
        "calls": len(rows),
        "tokens_received": sum(r.tokens_received for r in rows),
        "tokens_sent": sent,
        "completion_tokens": sum(r.completion_tokens for r in rows),
        "cache_read_tokens": read,
        "cache_write_tokens": sum(r.cache_write_tokens for r in rows),
        "cache_hit_ratio": round(read / sent, 4) if sent else 0.0,
        "summarizer_calls": sum(r.summarizer_calls for r in rows),
        "summaries_prepared": sum(r.summaries_prepared for r in rows),
        "summaries_used": sum(r.summaries_used for r in rows),
        "summaries_wasted": sum(r.summaries_wasted for r in rows),
        "rewrites": dict(sorted(rewrites.items())),
        "cost_usd": round(sum(costs), 8) if costs else None,
        "all_valid": all(r.valid for r in rows),
        "invalid_calls": [r.call for r in rows if not r.valid],
    }


def as_json(
    source: str,
    policy: str | None,
    rows: Sequence[TurnRow],
    against: tuple[str, Sequence[TurnRow], int | None] | None = None,
) -> JSON:
    out: JSON = {
        "source": source,
        "policy": rows[0].policy if rows else policy,
        "calls": [r.as_json() for r in rows],
        "totals": totals(rows),
    }
    if against is not None:
        name, other, first = against
        out["against"] = {
            "policy": other[0].policy if other else name,
            "calls": [r.as_json() for r in other],
            "totals": totals(other),
            "first_difference": first,
        }
    return out


def _rewrites(row: TurnRow) -> str:
    parts = []
    for w in row.rewrites:
        part = f"{w['stage']}.{w['action']}"
        if "tokens_before" in w:
            part += f" {w['tokens_before']}>{w['tokens_after']}"
        parts.append(part)
    return ", ".join(parts) or "-"


def _cost(value: float | None) -> str:
    return UNKNOWN if value is None else f"${value:.4f}"


def print_text(
    console: Console,
    source: str,
    rows: Sequence[TurnRow],
    against: tuple[str, Sequence[TurnRow], int | None] | None = None,
) -> None:
    policy = rows[0].policy if rows else "?"
    title = f"replay of {source} with policy {policy}"
    if against is not None:
        title += f" against {against[1][0].policy if against[1] else against[0]}"
    table = Table(title=title, title_justify="left")
    columns = ("call", "turn", "wire", "received", "sent", "cache hit", "cost", "valid", "rewrites")
    for column in columns:
        table.add_column(column, justify="right" if column in _NUMBERS else "left")
    others = against[1] if against is not None else [None] * len(rows)
    first = against[2] if against is not None else None
    for row, other in zip(rows, others, strict=True):
        mark = " *" if row.call == first else ""
        table.add_row(
            f"{row.call}{mark}",
            f"{row.turn} side" if row.side else str(row.turn),
            row.wire,
            str(row.tokens_received),
            _pair(row.tokens_sent, other and other.tokens_sent),
            _pair(f"{row.cache_hit_ratio:.0%}", other and f"{other.cache_hit_ratio:.0%}"),
            _pair(_cost(row.cost_usd), other and _cost(other.cost_usd)),
            _pair(_valid(row), other and _valid(other)),
            _pair(_rewrites(row), other and _rewrites(other)),
        )
    console.print(table)
    _print_totals(console, policy, rows)
    if against is not None and against[1]:
        _print_totals(console, against[1][0].policy, against[1])
    if against is not None:
        console.print(
            f"first call sent differently: {first}" if first is not None
            else "the two policies send the same bodies upstream on every call"
        )  # fmt: skip
    for row in rows:
        for problem in row.problems:
            console.print(f"call {row.call}: {problem}", markup=False, highlight=False)


def _print_totals(console: Console, policy: str, rows: Sequence[TurnRow]) -> None:
    t = totals(rows)
    saved = t["tokens_received"] - t["tokens_sent"]
    rewrites = ", ".join(f"{name} x{count}" for name, count in t["rewrites"].items()) or "none"
    console.print(
        f"[{policy}] {_counted(t['turns'], 'turn')}, {_counted(t['calls'], 'call')}: "
        f"tokens received {t['tokens_received']}, sent "
        f"{t['tokens_sent']} ({saved:+d} saved), cache hit {t['cache_hit_ratio']:.0%}, "
        f"cost {_cost(t['cost_usd'])}, summarizer calls {t['summarizer_calls']}, "
        f"summaries prepared ahead {t['summaries_prepared']} (used {t['summaries_used']}, "
        f"wasted {t['summaries_wasted']}), {_validity(t)}; "
        f"rewrites: {rewrites}",
        highlight=False,
        markup=False,
    )


def _counted(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _validity(t: JSON) -> str:
    return "every request valid" if t["all_valid"] else f"invalid calls {t['invalid_calls']}"


def _valid(row: TurnRow) -> str:
    return "yes" if row.valid else "NO"


def _pair(mine: Any, theirs: Any) -> str:
    return str(mine) if theirs is None else f"{mine} | {theirs}"

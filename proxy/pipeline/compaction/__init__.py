"""Compaction: fit the history to the target model's context window. One public entry, the
stage, with its named hooks: before the call `CompactionStage.run`, on overflow
`CompactionStage.after_overflow`.

    stage.py        the stage: reuse a checkpoint, truncate, summarize, middle-out; its hooks
    budget.py       token estimates, the window's budget, where a stretch may be cut
    memo.py         per-session estimates and prefix hashes, so a warm turn costs its new part
    plan.py         the output being built: head + replacement + the verbatim tail
    checkpoints.py  summaries keyed by prefix hash, reused byte for byte on later turns
    truncate.py     old writing-tool arguments cut to a head and an archive reference
    summarize.py    archive a stretch, then a summary (or the middle-out marker) replaces it
    summarizer.py   the summarizer's model call, through control, charged to the request
    overflow.py     the provider said "context exceeded": compact tighter, never loop
"""

from proxy.pipeline.compaction.stage import CompactionStage

__all__ = ["CompactionStage"]

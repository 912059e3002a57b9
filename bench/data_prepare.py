#!/usr/bin/env python3
"""Prepare throughput: samples/s and samples/s/core on ~2K-token samples.

    python bench/data_prepare.py [--samples 2000] [--tokens 2048] [--workers 1 2] [--tokenizer DIR]

Without --tokenizer it builds the tiny offline tokenizer (byte-level, few merges: tokenising costs per
token are similar to a real BPE, but the real Qwen tokenizer has 248K entries — use --tokenizer on a
node that has it). Prints one line per worker count; the per-core figure is samples/s / workers.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_TEXT = ("the of and to in is that for it as with was on be by this are from or have an they which one "
         "we can all there their has more if will about would make time so up out into then them these "
         "number 1 2 3 4 5 6 7 8 9 0 + - * / = ( ) x y z def return import class self")
WORDS = tuple(_TEXT.split())


def synth_record(i: int, rng: random.Random, tok: object, target_tokens: int) -> dict:
    def text(n_words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n_words))

    question = text(40)
    reasoning = text(int(target_tokens * 0.55))
    answer = text(int(target_tokens * 0.2))
    return {"id": f"b{i}", "messages": [
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer, "reasoning_content": reasoning}],
        "finish_reason": "stop"}


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the pool workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=2048, help="target tokens per sample")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--tokenizer", help="tokenizer dir (default: the tiny offline one)")
    args = ap.parse_args()

    from trainer.data.prepare import load_tokenizer, prepare
    from trainer.data.tiny_tokenizer import build_tiny_tokenizer

    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        tmpd = Path(tmp)
        tok_dir = Path(args.tokenizer) if args.tokenizer else tmpd / "tok"
        if not args.tokenizer:
            build_tiny_tokenizer(tok_dir)
        tok = load_tokenizer(tok_dir)
        rng = random.Random(0)
        # calibrate words -> tokens so samples land near --tokens
        probe = synth_record(0, rng, tok, 1000)
        text = tok.apply_chat_template(probe["messages"], tokenize=False, enable_thinking=True)
        n_tok = len(tok(text, add_special_tokens=False)["input_ids"])
        scale = args.tokens / n_tok * 1000
        src = tmpd / "gen" / "part-0.jsonl"
        src.parent.mkdir()
        with src.open("w") as fh:
            for i in range(args.samples):
                fh.write(json.dumps(synth_record(i, rng, tok, int(scale))) + "\n")
        print(f"input: {args.samples} samples, {src.stat().st_size / 1e6:.1f} MB, tokenizer {tok_dir} "
              f"(vocab {len(tok)}), cpu_count {os.cpu_count()}")
        print(f"load average before: {os.getloadavg()[0]:.1f} (a busy machine lowers wall-clock figures; "
              f"samples per CPU-second does not depend on it)")
        for w in args.workers:
            cpu0 = _cpu()
            t0 = time.perf_counter()
            res = prepare(src.parent, tmpd / f"out-{w}", tok_dir, max_length=args.tokens * 2, num_workers=w,
                          show_progress=False)
            dt = time.perf_counter() - t0
            cpu = _cpu() - cpu0
            c = res.manifest["counts"]
            mean_len = c["tokens"] / max(1, c["rows"])
            print(f"workers={w}: {c['samples']} samples in {dt:.1f}s (incl. worker start-up) -> "
                  f"{c['samples'] / dt:.0f} samples/s, {c['samples'] / dt / w:.0f} samples/s/core, "
                  f"{c['tokens'] / dt / 1e3:.0f}K tokens/s, mean {mean_len:.0f} tokens/sample; "
                  f"CPU {cpu:.1f}s -> {c['samples'] / cpu:.0f} samples per CPU-second")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

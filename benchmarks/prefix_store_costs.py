"""What the disk prefix store costs the engine thread: copying a slot's KV out (runner.snapshot,
on the engine thread between ticks), handing it to the store (save(), the write itself runs on
the store's thread), reading and checking an entry back (load) and putting it into a slot
(llama_state_seq_set_data). Prints one line per prefix length; nothing is asserted.

    python benchmarks/prefix_store_costs.py --lengths 700,3000 --repeat 5
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from _bench import int_list, machine_line, model_path


def main() -> None:
    ap = argparse.ArgumentParser(prog="prefix_store_costs.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="700,3000", help="prefix lengths in tokens, comma separated")
    ap.add_argument("--repeat", type=int, default=5, help="timed snapshots per length")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    lengths = sorted(int_list(ap, args.lengths, "--lengths"))

    from llamabatch.config import EngineConfig
    from llamabatch.core.plan import Chunk, StepPlan
    from llamabatch.llama import kv_state
    from llamabatch.llama.runner import LlamaRunner
    from llamabatch.params import SamplingParams
    from llamabatch.prefix_store import PrefixStore

    print(machine_line(args.model))
    slot_ctx = max(lengths) + 64
    runner = LlamaRunner(EngineConfig(n_parallel=2, n_ctx=2 * slot_ctx, threads=args.threads),
                         model_path(args.model))
    text = "The quick brown fox jumps over the lazy dog. " * (max(lengths) // 8 + 8)
    tokens = runner.tokenize(text, special=False)[: max(lengths)]
    sampler = runner.build_sampler(SamplingParams(temperature=0), 0)
    done = 0
    try:
        for length in lengths:
            while done < length:  # slot 0 evaluates the prefix up to this length
                n = min(512, length - done)
                runner.execute(StepPlan([Chunk(0, 0, tokens[done:done + n], done, True, False, sampler=sampler)]))
                done += n
            took = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                payload = runner.snapshot(0)
                took.append((time.perf_counter() - t0) * 1000)
            with tempfile.TemporaryDirectory() as folder:
                store = PrefixStore(folder, runner.kv_fingerprint, 1 << 32)
                t0 = time.perf_counter()
                store.save(tokens[:length], payload, owned=True)
                save_ms = (time.perf_counter() - t0) * 1000
                store.flush(60)
                hit = store.longest_starting(tokens[:length])
                t0 = time.perf_counter()
                _, loaded = store.load(hit)
                load_ms = (time.perf_counter() - t0) * 1000
                t0 = time.perf_counter()
                ok = kv_state.restore(runner.ctx, 1, loaded)
                restore_ms = (time.perf_counter() - t0) * 1000
                store.close()
            print(f"{length} tokens: {len(payload) / 1e6:.1f} MB; snapshot on the engine thread median "
                  f"{statistics.median(took):.1f} ms (min {min(took):.1f}); save() {save_ms:.1f} ms; "
                  f"load and checks {load_ms:.1f} ms; restore into a slot {restore_ms:.1f} ms ({'ok' if ok else 'REFUSED'})")
    finally:
        runner.free_sampler(sampler)
        runner.close()


if __name__ == "__main__":
    main()

"""Greedy generation with a KV cache on the corpus GPT-2 step model (issue 29: "a 64-token greedy generation in
tokens/s >= 1.3x onnxruntime's"), as a user runs it: the file as exported (`bench/zoo_models.py`'s gpt2_step:
transformers GPT2LMHeadModel, 2 layers, 4 heads of 32, vocabulary 1000, one token per step with
past_key_values in and present out; or `--model llama_step`: LlamaForCausalLM, 2 layers, 4 query heads sharing 2
key / value heads of 32, rotary positions), loaded with `ds.load_onnx(path)`, nothing declared.

Each loop starts from a prompt's cache (past length --prompt, random keys and values), then runs --tokens steps:
logits -> argmax -> the next input_ids, the attention mask one longer, each step's presents fed back as the next
step's pasts. dynshape writes the presents into two buffers it owns with `out=` (double-buffered: a step reads
one while it writes the other, as a decode loop does); onnxruntime runs `InferenceSession.run` (its default
path). Both must pick the same tokens (checked on the first loop). Rounds interleaved, medians, the CPU printed;
the first and second loops at each prompt length are printed apart (the first moves a bucket plan to each new past
length, the second puts back the states those moves left).

    python bench/zoo_models.py --only gpt2_step       # the model, once
    python bench/generate_bench.py [--threads 1] [--tokens 64] [--prompt 16,512] [--model llama_step]
                                   [--first-rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import dynshape as ds
from benchutil import cpu_model, limit_threads
from ort_util import ort_session
from zoo_models import BY_NAME


class Cache:
    """A step model's KV cache geometry, read off its corpus entry: the past inputs (past_k_0, past_v_0, ...) and
    their (heads, head_dim) (GPT-2's 4 of 32; Llama's step 2 key / value heads of 32)."""

    def __init__(self, name: str) -> None:
        m = BY_NAME[name]
        self.names = [x for x in m.inputs if x.startswith("past_")]
        _, self.heads, _, self.head_dim = m.probes[0][self.names[0]]
        self.layers = len(self.names) // 2


KV: list[str] = []  # the past inputs of the model benchmarked (main sets them)


def _present(name: str) -> str:
    return name.replace("past_", "present_")


def generate_dyn(exe, prompt: dict, tokens: int, bufs: list[dict], heads: int, head_dim: int) -> list[int]:
    past = {k: prompt[k] for k in KV}
    ids, p0 = prompt["input_ids"], prompt[KV[0]].shape[2]
    out_ids = []
    for i in range(tokens):
        n = p0 + i + 1
        out = {_present(k): np.ndarray((1, heads, n, head_dim), np.float32, buffer=bufs[i % 2][k])
               for k in KV}
        r = exe.run({"input_ids": ids, "attention_mask": np.ones((1, n), np.int64), **past}, out=out)
        nxt = int(np.argmax(r["logits"][0, -1]))
        out_ids.append(nxt)
        ids = np.array([[nxt]], np.int64)
        past = {k: r[_present(k)] for k in KV}
    return out_ids


def generate_ort(sess, names: list[str], prompt: dict, tokens: int) -> list[int]:
    past = {k: prompt[k] for k in KV}
    ids, p0 = prompt["input_ids"], prompt[KV[0]].shape[2]
    out_ids = []
    for i in range(tokens):
        n = p0 + i + 1
        r = dict(zip(names, sess.run(None, {"input_ids": ids, "attention_mask": np.ones((1, n), np.int64), **past})))
        nxt = int(np.argmax(r["logits"][0, -1]))
        out_ids.append(nxt)
        ids = np.array([[nxt]], np.int64)
        past = {k: r[_present(k)] for k in KV}
    return out_ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", default="16,512", help="past lengths the loops start from, comma-separated")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--model", default="gpt2_step", help="a corpus step model: gpt2_step or llama_step")
    ap.add_argument("--first-rounds", type=int, default=5,
                    help="first loops per prompt length, each from a past length past the last one's end (every "
                         "step a key not seen yet); their median is printed (one loop's time moved 30%% run to run)")
    args = ap.parse_args()
    limit_threads(args.threads)
    cache = Cache(args.model)
    KV[:] = cache.names
    heads, hd = cache.heads, cache.head_dim
    m = BY_NAME[args.model]
    path = m.path()
    exe = ds.compile(ds.load_onnx(path))
    sess = ort_session(path, args.threads)
    names = [o.name for o in sess.get_outputs()]
    limit_threads(args.threads)
    print(f"CPU: {cpu_model()}; threads {args.threads}; {args.model} ({cache.layers} layers, {heads} key / value "
          f"heads of {hd}), loaded with ds.load_onnx(path), nothing declared; {args.tokens} tokens per loop")
    print(f"first loops: the median of {args.first_rounds}, from the prompt's past length and past each one's end")
    print("| prompt (past) | dynshape tokens/s | onnxruntime tokens/s | dyn / ort | first loop: dynshape | "
          "onnxruntime | dyn / ort | second loop: dynshape | onnxruntime | dyn / ort |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    seen = -1  # the largest past length a loop reached so far: a later prompt's first loops must start past it
    for p0 in (int(x) for x in args.prompt.split(",")):
        if p0 <= seen:
            raise SystemExit(f"prompt {p0}: the first loops before reached past {seen}; give prompt lengths more "
                             f"than --first-rounds x (--tokens + 1) apart")
        def prompt_at(past: int) -> dict:  # a prompt's cache of `past` random keys and values, token 7 next
            return {"input_ids": np.array([[7]], np.int64),
                    **{k: rng.standard_normal((1, heads, past, hd)).astype(np.float32) for k in KV}}

        prompt = prompt_at(p0)
        span = args.tokens + 1
        cap = p0 + args.first_rounds * span
        bufs = [{k: np.empty(heads * cap * hd, np.float32) for k in KV} for _ in range(2)]
        # first loops: every step a past length this executable has not seen (the first loop from p0 binds its
        # bucket plans on the way, what a user's first generation gets; the later ones, from p0 + r * span, move
        # the plans to new keys only); the rounds after them reuse the states the moves left
        firsts: dict[str, list[float]] = {"dyn": [], "ort": []}
        for r in range(args.first_rounds):
            start = prompt if r == 0 else prompt_at(p0 + r * span)
            t = time.perf_counter()
            a = generate_dyn(exe, start, args.tokens, bufs, heads, hd)
            t_first = time.perf_counter()
            b = generate_ort(sess, names, start, args.tokens)
            firsts["dyn"].append(args.tokens / (t_first - t))
            firsts["ort"].append(args.tokens / (time.perf_counter() - t_first))
            if a != b:
                raise SystemExit(f"past {p0 + r * span}: the two picked different tokens: {a[:8]}... vs {b[:8]}...")
        first = {k: statistics.median(v) for k, v in firsts.items()}
        seen = p0 + args.first_rounds * span
        # the second loop: every past length seen once (dynshape puts back the states its first loop's moves left,
        # runtime/key_states.py; it used to bind each key's own plan here, ~1.1 ms a token)
        t = time.perf_counter()
        generate_dyn(exe, prompt, args.tokens, bufs, heads, hd)
        t_second = time.perf_counter()
        generate_ort(sess, names, prompt, args.tokens)
        second = {"dyn": args.tokens / (t_second - t), "ort": args.tokens / (time.perf_counter() - t_second)}
        times: dict[str, list[float]] = {"dyn": [], "ort": []}
        for r in range(args.rounds):
            order = (("dyn", lambda p=prompt, b=bufs: generate_dyn(exe, p, args.tokens, b, heads, hd)),
                     ("ort", lambda p=prompt: generate_ort(sess, names, p, args.tokens)))
            for k, f in (order if r % 2 == 0 else order[::-1]):
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
        tps = {k: args.tokens / statistics.median(v) for k, v in times.items()}
        print(f"| {p0} | {tps['dyn']:.0f} | {tps['ort']:.0f} | {tps['dyn'] / tps['ort']:.2f} | "
              + " | ".join(f"{d['dyn']:.0f} | {d['ort']:.0f} | {d['dyn'] / d['ort']:.2f}" for d in (first, second))
              + " |", flush=True)


if __name__ == "__main__":
    main()

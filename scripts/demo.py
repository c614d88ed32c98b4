"""Client half of scripts/demo.sh: submit a 20-prompt bulk job, poll it, print results and the speedup table.
Standard library only, so it runs against any deployment:
    EAGLE3_API_KEY=e3k_... python scripts/demo.py --url http://host:8080"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Write a haiku about autumn leaves.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Give three tips for writing clean Python code.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "What is the difference between a list and a tuple in Python?",
    "Describe how a bicycle works to a ten-year-old.",
    "List five healthy breakfast ideas.",
    "Why do cats purr?",
    "Write a short, polite email declining a meeting invitation.",
    "What causes the seasons on Earth?",
    "Explain what a hash table is.",
    "Suggest a name for a coffee shop that also sells books.",
    "How do vaccines train the immune system?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "What are the main differences between TCP and UDP?",
    "Write a limerick about a programmer who loves coffee.",
    "Why is the ocean salty?",
    "Give a one-sentence definition of machine learning.",
    "What should I pack for a weekend hiking trip?",
]


API_KEY = os.environ.get("EAGLE3_API_KEY", "")


def call(url: str, method: str = "GET", body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if API_KEY:
        headers["Authorization"] = f"Bearer {API_KEY}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_healthy(base: str, timeout: float) -> None:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            status, body = call(f"{base}/health")
            if status == 200:
                return
            last = body.get("detail")
        except (urllib.error.URLError, ConnectionError) as exc:
            last = str(exc)
        time.sleep(1)
    sys.exit(f"the service did not become healthy in {timeout:.0f} s: {last}")


def fmt(value, spec=".2f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the job")
    parser.add_argument("--heldout", type=int, help="submit this many of eagle3's held-out prompts instead")
    parser.add_argument("--json", help="also write the final job, its wall time and item count here")
    parser.add_argument("--quiet", action="store_true", help="do not print every result")
    parser.add_argument("--key", default=None, help="API key (default: $EAGLE3_API_KEY)")
    args = parser.parse_args()
    global API_KEY
    API_KEY = args.key or API_KEY
    if not API_KEY:
        sys.exit("an API key is needed: --key e3k_... or EAGLE3_API_KEY (python -m api.keys create --name demo)")
    base = args.url.rstrip("/")
    prompts = PROMPTS
    if args.heldout:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from eagle3.prompts import heldout_prompts
        prompts = [p["prompt"] for p in heldout_prompts()][: args.heldout]

    wait_healthy(base, 300)
    job = {"type": "generation",
           "items": [{"custom_id": f"prompt-{i:02d}", "prompt": p} for i, p in enumerate(prompts)],
           "params": {"max_new_tokens": args.max_new_tokens, "temperature": 0.0, "measure_baseline": True},
           "metadata": {"source": "demo"}}
    status, created = call(f"{base}/v1/jobs", "POST", job)
    if status != 202:
        sys.exit(f"submission failed ({status}): {json.dumps(created, indent=1)}")
    job_id = created["id"]
    print(f"--- job {job_id}: {len(prompts)} prompts, max_new_tokens={args.max_new_tokens}, measure_baseline=true")

    started, shown = time.monotonic(), None
    while True:
        _, state = call(f"{base}/v1/jobs/{job_id}")
        counts = state["item_counts"]
        line = f"{state['status']:<10} {counts['completed'] + counts['failed']}/{counts['total']} items"
        if line != shown:
            print(f"  {time.monotonic() - started:6.1f} s  {line}", flush=True)
            shown = line
        if state["status"] in ("completed", "failed", "cancelled"):
            break
        if time.monotonic() - started > args.timeout:
            sys.exit(f"job {job_id} still {state['status']} after {args.timeout:.0f} s")
        time.sleep(0.5)
    wall = time.monotonic() - started
    if args.json:
        Path(args.json).write_text(json.dumps(dict(job=state, wall_s=wall, items=len(prompts)), indent=1))

    _, page = call(f"{base}/v1/jobs/{job_id}/results?limit=1000")
    print("\n--- results")
    for r in page["data"][: 3 if args.quiet else None]:
        text = (r["output"] or {}).get("text", "") if r["error"] is None else f"ERROR: {r['error']['message']}"
        text = " ".join(text.split())
        stats = r["stats"] or {}
        print(f"{r['custom_id']}  [{stats.get('new_tokens', 0):3d} tok, tau {stats.get('accept_length', 0):.2f}]  "
              f"{text[:96]}")

    st, counts = state["stats"], state["item_counts"]
    sample = [r for r in page["data"] if r["stats"] and r["baseline_stats"]]
    spec_tokens = sum(r["stats"]["new_tokens"] for r in sample)
    base_tokens = sum(r["baseline_stats"]["new_tokens"] for r in sample)
    spec_time = sum(r["stats"]["time_share_s"] for r in sample)
    base_time = sum(r["baseline_stats"]["time_share_s"] for r in sample)
    print(f"\n--- speedup table: job {state['status']}, {counts['completed']} items completed, {counts['failed']} "
          f"failed; speedup {st['speedup_kind']} on {st['baseline_sample_items']} sampled items decoded both ways "
          "in identical batches")
    print(f"{'decoding':<22} {'items':>5} {'new tokens':>10} {'decode s':>9} {'tokens/s':>9} {'tau':>5} "
          f"{'speedup':>8}")
    print(f"{'vanilla (sample)':<22} {len(sample):>5} {base_tokens:>10} {base_time:>9.1f} "
          f"{fmt(st['baseline_tokens_per_s']):>9} {'-':>5} {'1.00x':>8}")
    print(f"{'EAGLE-3 (sample)':<22} {len(sample):>5} {spec_tokens:>10} {spec_time:>9.1f} "
          f"{fmt(st['sample_tokens_per_s']):>9} {'':>5} {fmt(st['speedup']) + 'x':>8}")
    print(f"{'EAGLE-3 (all items)':<22} {counts['completed']:>5} {st['new_tokens']:>10} {st['decode_time_s']:>9.1f} "
          f"{fmt(st['tokens_per_s']):>9} {fmt(st['mean_accept_length']):>5} {'':>8}")
    print(f"target forwards {st['target_forwards']} for {st['new_tokens']} new tokens; tau = tokens per draft/verify "
          "round (1.00 = no draft token accepted)")


if __name__ == "__main__":
    main()

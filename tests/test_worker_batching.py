"""The worker pulls up to batch_size items at a time and decodes them together; the result of an item does not
depend on the batch it ran in."""
import time

from conftest import all_results, submit, wait_for

PROMPTS = ["Hello, ", "What is the capital of France?", "Write a haiku about rain.", "Count to five.",
           "Explain gravity to a child.", "Name three fruits.", "Translate 'cat' to German.", "Why is the sky blue?"]
PARAMS = {"max_new_tokens": 12}


def quiet(client, job_ids, seconds: float = 1.0):
    """Wait for the jobs, then past two flush intervals (0.3 s each) so the next job starts a fresh batch."""
    for job_id in job_ids:
        wait_for(client, job_id)
    time.sleep(seconds)


def test_results_identical_in_a_batch_of_1_and_of_8(client, worker):
    quiet(client, [])
    batched = submit(client, {"items": [{"custom_id": str(i), "prompt": p} for i, p in enumerate(PROMPTS)],
                              "params": PARAMS})
    quiet(client, [batched["id"]])
    together = all_results(client, batched["id"])
    assert [r["stats"]["batch_items"] for r in together] == [8] * 8  # one generate() call for all eight

    alone = []
    for prompt in PROMPTS:
        single = submit(client, {"items": [{"prompt": prompt}], "params": PARAMS})
        quiet(client, [single["id"]], seconds=0.7)
        alone += all_results(client, single["id"])
    assert [r["stats"]["batch_items"] for r in alone] == [1] * 8
    for one, eight in zip(alone, together):
        assert one["output"] == eight["output"]  # same token ids and text at temperature 0


def test_a_large_job_is_decoded_batch_size_at_a_time(client, worker):
    quiet(client, [])
    created = submit(client, {"items": [{"prompt": f"Item {i}"} for i in range(20)], "params": {"max_new_tokens": 4}})
    wait_for(client, created["id"])
    sizes = [r["stats"]["batch_items"] for r in all_results(client, created["id"])]
    assert max(sizes) == 8 and all(1 <= s <= 8 for s in sizes)


def test_items_with_different_params_are_grouped_and_honoured(client, worker):
    created = submit(client, {"items": [{"prompt": "Short", "max_new_tokens": 2},
                                        {"prompt": "Longer", "max_new_tokens": 10},
                                        {"prompt": "Default"},
                                        {"prompt": "Wide tree", "parallel_degree": 2},
                                        {"prompt": "Sampled", "temperature": 0.8, "top_p": 0.9, "seed": 7}],
                              "params": {"max_new_tokens": 5}})
    job = wait_for(client, created["id"])
    assert job["status"] == "completed"
    results = all_results(client, created["id"])
    assert [r["stats"]["new_tokens"] <= limit for r, limit in zip(results, [2, 10, 5, 5, 5])] == [True] * 5
    assert all(r["stats"]["batch_items"] == 1 for r in results)  # five different param sets, five calls

"""The draft budget: calibrated acceptance, nodes kept by expected rate under the device's cost curve, plain steps
where no node pays, and probes that grow rarer while plain steps keep winning."""
import numpy as np
import pytest
import torch

from eagle3.budget import MODEL, PLAIN, PROBE_SHARE, Calibration, DraftBudget, bucket, surest
from eagle3.profile import Profile
from eagle3.tree import from_nodes
from eagle3.verify import Accepted

# seconds of a verify forward: a fixed part plus a per-token part (a CPU's shape), over rows x nodes
ROWS, NODES = [1, 8, 32], [1, 2, 4, 8, 16]
CPU_LIKE = Profile("cpu", ROWS, NODES, [[0.015 + 0.002 * r * n for n in NODES] for r in ROWS])
FLAT = Profile("flat", ROWS, NODES, [[0.02 for _ in NODES] for _ in ROWS])  # nodes free: a GPU at small batch
# measured on a 2-core AVX2-only EPYC (eagle3.profile, 2026-12-07): from 8 rows a token costs at least its share
AVX2 = Profile("avx2", ROWS, NODES, [[0.0185, 0.0227, 0.0316, 0.0515, 0.0813],
                                     [0.0488, 0.1033, 0.1511, 0.2972, 0.6224],
                                     [0.1617, 0.3923, 0.7491, 1.6204, 2.8318]])


def chain_tree(rows, scores):
    """Every row: one chain root -> 1 -> 2 -> ... with the given per-level scores."""
    nodes = [[(i, 10 + i) for i in range(len(scores))] for _ in range(rows)]
    return from_nodes(torch.zeros(rows, dtype=torch.long), nodes, [list(scores)] * rows)


def test_calibration_trusts_the_drafter_until_it_has_counts():
    cal = Calibration(depth=3, prior=4.0)
    s, d = np.array([0.85, 0.15]), np.array([1, 2])
    assert cal(s, d) == pytest.approx(s)
    cal.add(np.full(20, 0.85), np.ones(20, int), np.array([True] * 5 + [False] * 15))  # 0.85 drafted, 25% accepted
    got = cal(s, d)
    scale = (5 + 4) / (20 * 0.85 + 4)  # depth 1's scores ran high: its thin bins lean on scaled-down scores
    assert got[0] == pytest.approx((5 + 4 * 0.85 * scale) / (20 + 4)) and got[1] == pytest.approx(0.15)
    assert cal(np.array([0.55]), np.array([1]))[0] == pytest.approx(0.55 * scale)  # an unmeasured bin at depth 1


def test_calibration_believes_an_underconfident_drafter_after_a_few_nodes():
    cal = Calibration(depth=3, prior=4.0)
    cal.add(np.full(12, 0.35), np.ones(12, int), np.array([True] * 10 + [False] * 2))  # 0.35 drafted, 83% accepted
    got = cal(np.array([0.35, 0.45, 0.45]), np.array([1, 1, 2]))
    assert got[0] > 0.7  # the measured bin
    assert got[1] == pytest.approx(0.45 * 14 / (12 * 0.35 + 4))  # an unmeasured bin at the same depth: scores there run low too
    assert got[2] == pytest.approx(0.45)  # another depth: nothing measured yet


def test_surest_caps_a_node_by_its_ancestors():
    tree = from_nodes(torch.tensor([0]), [[(0, 1), (1, 2), (0, 3)]], [[0.3, 0.9, 0.6]])
    p = surest(tree.score.numpy(), tree.valid.numpy(), tree.mask.numpy())
    assert p == pytest.approx(np.array([[1.0, 0.3, 0.3, 0.6]]))


def test_trim_keeps_the_surest_nodes_when_nodes_cost_time():
    budget = DraftBudget((2, 4, 8), CPU_LIKE)
    tree = chain_tree(1, [0.95, 0.9, 0.2, 0.1])
    kept = budget.trim(tree, True)
    # at batch 1 a node costs 2 ms of a 17 ms step: the 0.95 and 0.9 levels pay, 0.2 and 0.1 do not
    assert kept.tokens.tolist() == [[0, 10, 11]] and kept.parents.tolist() == [[0, 0, 1]]
    assert kept.mask.tolist() == [[[True, False, False], [True, True, False], [True, True, True]]]
    assert kept.depth.tolist() == [[0, 1, 2]]


def test_trim_fills_the_compiled_bucket_it_pays_for():
    from eagle3.compiled import bucket

    budget = DraftBudget((2, 4, 8), CPU_LIKE)
    budget.padded = bucket  # 3 nodes cost what 4 do, as compiled steps compute them
    kept = budget.trim(chain_tree(1, [0.95, 0.9, 0.2, 0.1]), True)
    # unpadded, the 0.2 level does not pay (the test above); in the 4-token bucket it comes free, the 0.1 level
    # would cost the 8-token bucket
    assert kept.tokens.tolist() == [[0, 10, 11, 12]]


def test_trim_keeps_every_node_when_nodes_are_free_and_none_when_they_are_dear():
    tree = chain_tree(8, [0.6, 0.5, 0.4, 0.3])
    assert DraftBudget((2, 4, 8), FLAT).trim(tree, True).size == 5
    assert DraftBudget((2, 4, 8), CPU_LIKE).trim(chain_tree(32, [0.3, 0.2, 0.1, 0.05]), True).size == 1  # plain


def test_plan_drafts_where_it_pays_and_probes_ever_more_rarely_where_it_does_not():
    budget = DraftBudget((2, 4, 8), CPU_LIKE)
    assert budget.plan(1, True) == (2, 4, 8)  # nothing measured yet: draft the whole tree once
    budget.trim(chain_tree(1, [0.9, 0.8, 0.3, 0.1]), True)  # learns the gain curves
    for d in (1, 2, 3, 4):
        budget.draft_s[(0, d)], budget.draft_s[(5, d)] = 0.001 * d, 0.01 * d
    assert budget.plan(1, True) == (2, 2, 8)  # two sure levels pay at batch 1; deeper ones cost more than they give
    picks = [budget.plan(32, True) for _ in range(600)]  # 32 rows: a level costs 64 ms + 10 ms of drafting
    probes = [i for i, s in enumerate(picks) if s is not PLAIN]
    assert len(probes) <= 7 and probes[0] == 15 and all(picks[i] == (2, 1, 8) for i in probes)  # the best depth
    gaps = np.diff(probes)
    assert (gaps[1:] == 2 * gaps[:-1]).all()  # each probe that loses doubles the wait
    deeper = [budget.plan(1, True) for _ in range(2 * budget.first_explore)]
    assert deeper.count((2, 3, 8)) == 2 and deeper.count((2, 2, 8)) == 30  # now and then one level deeper


def test_observe_calibrates_acceptance_and_scales_the_profile():
    budget = DraftBudget((2, 4, 8), CPU_LIKE)
    tree = chain_tree(2, [0.95, 0.95, 0.95, 0.95])
    path = torch.tensor([[0, 1, 2, 2, 2], [0, 0, 0, 0, 0]])
    acc = Accepted(path, torch.tensor([3, 1]), torch.tensor([5, 5]))  # row 0 took two levels, row 1 none
    budget.observe((2, 4, 8), tree, acc, True, verify_s=2 * CPU_LIKE.cost(2, 5), draft_s=0.5)  # warm-up: not a sample
    assert budget.draft_s == {} and budget.tree_extra == 1.0  # a shape's first forward may compile: no sample
    budget.observe((2, 4, 8), tree, acc, True, verify_s=2 * CPU_LIKE.cost(2, 5), draft_s=0.004)
    cal = budget.calibration[True]
    assert cal.seen[1:5, 9].tolist() == [4, 4, 4, 4] and cal.hits[1:5, 9].tolist() == [2, 2, 0, 0]
    assert budget.tree_extra == pytest.approx(1.1) and budget.level == 1.0  # 10% of the way to 2x
    plain = from_nodes(torch.zeros(2, dtype=torch.long), [[], []])
    for seconds in (100.0, 3 * CPU_LIKE.cost(2, 1)):  # the first plain step compiling its graphs, then a sample
        budget.observe(PLAIN, plain, Accepted(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, dtype=torch.long),
                                              torch.zeros(2, dtype=torch.long)), True, seconds, 0.0)
    assert budget.level == pytest.approx(1.2) and budget.cost(2, 5) == pytest.approx(CPU_LIKE.cost(2, 5) * 1.2 * 1.1)
    assert budget.draft_s[(1, 4)] == 0.004
    assert budget.drafting(2, 1) == pytest.approx(0.004 * 2 / 5)  # another depth, scaled by its levels


def test_plan_discounts_trees_by_how_their_predictions_held_up():
    budget = DraftBudget((2, 2, 4), CPU_LIKE)
    budget.plan(1, True)
    budget.trim(chain_tree(1, [0.9, 0.8]), True)
    budget.draft_s[(0, 1)] = budget.draft_s[(0, 2)] = 0.001
    assert budget.plan(1, True) is not PLAIN
    tree = chain_tree(1, [0.9, 0.8])
    for _ in range(40):  # every tree round emits one token in twice the predicted time: drafting does not pay
        budget.plan(1, True)
        budget.observe((2, 2, 4), tree, Accepted(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, dtype=torch.long),
                                                 torch.zeros(1, dtype=torch.long)), True, CPU_LIKE.cost(1, 3), 0.03)
    assert budget.realism[0] < 0.5 and budget.plan(1, True) is PLAIN


def test_where_no_tree_can_win_the_plan_never_drafts_one():
    """At 32 rows on the AVX2 EPYC's profile even a chain with every level accepted loses to plain steps (d + 1
    tokens for more than d + 1 plain steps' seconds): every round is plain, the first included, and no probe. At
    batch 1 trees can pay, and the first round drafts the whole tree to learn from."""
    budget = DraftBudget((2, 4, 8), AVX2)
    assert not any(budget.can_pay(32, d) for d in range(1, 5))
    assert all(budget.plan(32, True) is PLAIN for _ in range(3000))
    assert budget.can_pay(1, 1) and budget.plan(1, True) == (2, 4, 8)
    budget.trim(chain_tree(1, [0.9, 0.8, 0.3, 0.1]), True)
    assert all(budget.plan(32, True) is PLAIN for _ in range(3000))
    assert budget.can_pay(8, 3) and not budget.can_pay(8, 1)  # at 8 rows only deeper chains could
    budget.draft_s[(3, 3)] = 0.05  # ... until their drafting costs more than they could save
    assert not budget.can_pay(8, 3)


def plain_round(rows):
    tree = from_nodes(torch.zeros(rows, dtype=torch.long), [[] for _ in range(rows)])
    z = torch.zeros(rows, dtype=torch.long)
    return tree, Accepted(z[:, None], z + 1, z)


def measured_budget():
    """Batch 1, where the model drafts depth 2 (its gain curves and drafting costs set as in the tests above)."""
    budget = DraftBudget((2, 4, 8), CPU_LIKE, samples=2, refresh=10)
    budget.plan(1, True)
    budget.trim(chain_tree(1, [0.9, 0.8, 0.3, 0.1]), True)
    for d in (1, 2, 3, 4):
        budget.draft_s[(0, d)] = 0.001 * d
    assert budget.plan(1, True) == (2, 2, 8)
    return budget


def run(budget, rounds, rates, catch_up_s=0.0):
    """Plan and observe `rounds` rounds at batch 1 whose whole rounds give rates[arm] tokens/s (arm: PLAIN or a
    depth; a tree round emits 2 tokens), a tree after plain steps first catching up for catch_up_s; returns the arms
    taken."""
    tree, acc = chain_tree(1, [0.9, 0.8]), Accepted(torch.tensor([[0, 1, 1]]), torch.tensor([2]), torch.tensor([5]))
    plain, plain_acc = plain_round(1)
    taken = []
    for _ in range(rounds):
        shape = budget.plan(1, True)
        arm = PLAIN if shape is PLAIN else shape[1]
        taken.append(arm)
        if arm is PLAIN:
            budget.observe(PLAIN, plain, plain_acc, True, 0.01, 0.0, round_s=1 / rates[PLAIN])
        else:
            after_plain = len(taken) > 1 and taken[-2] is PLAIN
            budget.observe(shape, tree, acc, True, 0.01, 0.001, round_s=2 / rates[arm],
                           catch_up_s=catch_up_s if after_plain else 0.0)
    return taken


def test_measured_arms_settle_on_the_fastest_and_keep_checking_its_neighbours():
    """The model starts at depth 2; plain steps are measured as the yardstick, then depths 1 and 3 around the best;
    the fastest measured arm (depth 3 here) is kept, and its neighbours are re-measured every `refresh` rounds."""
    budget = measured_budget()
    rates = {PLAIN: 100.0, 1: 90.0, 2: 120.0, 3: 140.0, 4: 110.0}
    taken = run(budget, 60, rates)
    assert taken[:3] == [2, 2, 2]  # the model's choice (its first round compiles: not a sample)
    assert PLAIN in taken[:8] and 1 in taken[:12] and 3 in taken[:12] and 4 in taken[:20]
    late = taken[30:]
    assert late.count(3) >= 26 and set(late) <= {2, 3, 4}  # depth 3 kept; 2 and 4 re-measured now and then
    assert budget.measured[0][3][0] == pytest.approx(140.0 * budget._profiled(1, 1))  # relative to the profile


def probes(taken, arms):
    """Where a run of rounds of one of `arms` begins: (index, arm)."""
    return [(i, a) for i, a in enumerate(taken) if a in arms and (i == 0 or taken[i - 1] != a)]


def test_measured_plain_steps_win_over_a_model_that_predicts_trees():
    """The model drafts depth 2, but whole tree rounds of every depth measure slower than plain steps: after the
    first samples nearly every round is plain; depth 1 (plain's neighbour) and depth 2 (the model's choice) are
    re-measured in turn, `samples` rounds at a time, each time after twice as long, and never so soon that the probes
    take more than PROBE_SHARE of the time."""
    budget = measured_budget()
    taken = run(budget, 3000, {PLAIN: 100.0, 1: 95.0, 2: 80.0, 3: 70.0, 4: 60.0})
    late = probes(taken[30:], {1, 2, 3, 4})
    assert {a for _, a in late} == {1, 2}
    assert all(taken[30 + i: 32 + i] == [a, a] for i, a in late)  # samples=2 rounds in a row
    gaps = np.diff([i for i, _ in late])
    # each re-measurement waits twice as long, up to max_explore rounds
    assert len(gaps) >= 3 and (gaps[1:] >= np.minimum(2 * gaps[:-1] - 2, budget.max_explore)).all()
    probe = 2 * (2 / 95.0) / (1 / 100.0)  # two depth-1 rounds' seconds in plain rounds
    assert (gaps >= probe / PROBE_SHARE - 1).all()


def test_a_re_measurement_replaces_an_arms_old_speed():
    """Depth 2 measured slow once (a busy minute), then the machine is as before: re-measured after plain steps
    took over, its speed is what its new rounds measure, not a running average still weighed down by the old ones,
    and the budget goes back to it."""
    budget = measured_budget()
    run(budget, 12, {PLAIN: 100.0, 1: 50.0, 2: 60.0, 3: 50.0, 4: 50.0})
    assert budget.plan(1, True) is PLAIN
    taken = run(budget, 1500, {PLAIN: 100.0, 1: 50.0, 2: 150.0, 3: 50.0, 4: 50.0})
    assert taken[-100:].count(2) >= 95
    assert budget.measured[0][2][0] == pytest.approx(150.0 * budget._profiled(1, 1), rel=0.02)


def test_a_trees_catch_up_after_plain_steps_spaces_its_probes_but_not_its_speed():
    """Depth 2 is the fastest arm in steady rounds, and every probe of it after plain steps first pays a catch-up
    of 10 plain rounds' seconds: counted in the arm's speed, such probes would keep it below plain steps for good.
    The budget still finds and keeps depth 2; where plain steps are best, the catch-up spaces the probes so that they
    stay a PROBE_SHARE of the time."""
    budget = measured_budget()
    taken = run(budget, 200, {PLAIN: 100.0, 1: 90.0, 2: 120.0, 3: 110.0, 4: 100.0}, catch_up_s=0.1)
    assert taken[100:].count(2) >= 90
    budget = measured_budget()
    taken = run(budget, 3000, {PLAIN: 100.0, 1: 95.0, 2: 80.0, 3: 70.0, 4: 60.0}, catch_up_s=0.1)
    late = probes(taken[10:], {1, 2, 3, 4})
    assert budget.catch_up[0] == pytest.approx(0.1) and len(late) >= 2
    # re-measurements wait until they cost a PROBE_SHARE of the time, their catch-up included (without one the first
    # comes sooner, test above)
    probe = (2 * (2 / 95.0) + 0.1) / (1 / 100.0)
    assert (np.diff([i for i, _ in late]) >= probe / PROBE_SHARE - 1).all()


def test_arms_of_many_rows_are_trusted_after_fewer_rounds():
    """`samples` counts rows' worth of rounds: at 32 rows two rounds of each arm are enough (each averages 32 rows'
    accepted lengths, and a probe of a losing tree costs several plain rounds there); at batch 1 they are not."""
    budget = DraftBudget((2, 4, 8), CPU_LIKE)  # samples=8
    measured = {PLAIN: [1.0, 2, 0, 1, 1], 1: [0.7, 2, 0, 1, 1], 2: [0.5, 2, 0, 1, 1]}
    budget.clock = {bucket(32): 1, bucket(1): 1}
    budget.measured = {bucket(32): dict(measured), bucket(1): dict(measured)}
    assert budget._measured_arm(32, 2) is PLAIN
    assert budget._measured_arm(1, 2) == MODEL


def test_measured_tree_rounds_overrule_a_plan_that_predicts_plain_steps():
    budget = DraftBudget((2, 4, 8), CPU_LIKE, samples=2)
    budget.plan(32, True)
    budget.trim(chain_tree(32, [0.9, 0.8, 0.3, 0.1]), True)
    for d in (1, 2, 3, 4):
        budget.draft_s[(5, d)] = 0.01 * d
    assert budget.plan(32, True) is PLAIN  # the model: a level costs 64 ms + 10 ms of drafting at 32 rows
    # measured: depth 1 is faster ([relative speed, rounds, last round, running tokens' plain seconds, seconds])
    budget.measured[bucket(32)] = {PLAIN: [0.6, 2, 0, 1, 1], 1: [0.9, 2, 0, 1, 1], 2: [0.7, 2, 0, 1, 1]}
    assert budget.plan(32, True) == (2, 1, 8)
    budget.measured[bucket(32)][1][0] = budget.measured[bucket(32)][2][0] = 0.5  # now every measured depth is slower
    assert budget.plan(32, True) is PLAIN


def test_a_batchs_tail_reads_its_buckets_measurements_instead_of_probing_again():
    """Rows finishing one by one (32, then 30, 25, 20 rows) stay in one bucket: what was measured at 32 rows decides
    at 30, 25 and 20 rows too, without probing; a round's speed is counted relative to the profile's plain step at its
    own row count, so the counts compare."""
    budget = DraftBudget((2, 4, 8), CPU_LIKE, samples=2)
    budget.plan(32, True)
    budget.trim(chain_tree(32, [0.9, 0.8, 0.3, 0.1]), True)
    for d in (1, 2, 3, 4):
        budget.draft_s[(5, d)] = 0.01 * d
    budget.measured[bucket(32)] = {PLAIN: [1.0, 2, 0, 1, 1], 1: [0.7, 2, 0, 1, 1], 2: [0.6, 2, 0, 1, 1]}
    assert [budget.plan(rows, True) for rows in (30, 25, 20)] == [PLAIN] * 3
    tree, acc = plain_round(20)
    budget.warm.add(("verify", 20, 1))  # not the shape's first run
    budget.observe(PLAIN, tree, acc, True, 0.05, 0.0, round_s=0.05)
    # running tokens' profiled plain seconds and running seconds, from 1 and 1: 20 tokens at 20 rows, 0.05 s
    tok, sec = 1 + 0.1 * (20 * budget._profiled(20, 1) / 20 - 1), 1 + 0.1 * (0.05 - 1)
    assert budget.measured[bucket(32)][PLAIN][0] == pytest.approx(tok / sec, rel=1e-6)
    assert bucket(16) not in budget.measured  # another bucket: its own measurements

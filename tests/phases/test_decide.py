import dataclasses
import math

import pytest

from marin_assets.phases import (
    ACTIONS,
    ArchitectureSwitch,
    BandSignal,
    PhasePlan,
    PhaseSpec,
    RunState,
    Signals,
    decide,
    drop_rate_alarm,
    loss_spike,
    normalise,
    phase_train_config,
)

M = 1_000_000
KESTREL = PhaseSpec(
    name="kestrel",
    warm_start_from=None,
    schedule="wsd_s",
    mixture={"dclm": 0.7, "starcoder": 0.2, "proofpile": 0.1},
    batch_size=1024,
    hardware="v4-1024",
    token_budget=100 * M,
    peak_lr=1e-3,
)
PLAN = PhasePlan(
    run="tootsie-8b",
    first=KESTREL,
    high_quality_sources=("flan", "wiki"),
    cooldown_hq_fraction=0.3,
    cooldown_tokens=10 * M,
    min_cooldown_tokens=1 * M,
    low_data_tokens=5 * M,
    rewarm_mixture={"nemotron": 0.6, "starcoder": 0.2, "flan": 0.2},
    rewarm_tokens=50 * M,
    late_cooldown_z_loss=1e-4,
    hardware_ladder={"v4-1024": 1.0, "v4-1536": 1.5, "v4-256": 0.25},
)
PLENTY = {"dclm": 500 * M, "starcoder": 100 * M, "proofpile": 50 * M, "flan": 20 * M, "wiki": 20 * M, "nemotron": 400 * M}
FLAT = tuple(2.0 + 0.01 * (i % 3) for i in range(20))


def state(phase=KESTREL, phase_tokens=10 * M, trained=10 * M, done=(), cooldowns=0):
    return RunState(
        phase=phase,
        phase_tokens=phase_tokens,
        tokens_trained=trained,
        phases_done=done,
        cooldowns_done=cooldowns,
        last_good_checkpoint="ckpt/step-100",
    )


def signals(left=None, budget=1000 * M, hw=(), losses=FLAT, band=None, drops=()):
    return Signals(
        tokens_left=dict(PLENTY if left is None else left),
        budget_tokens=budget,
        hardware_available=hw,
        recent_losses=losses,
        off_band=band,
        recent_drop_rates=drops,
    )


def test_continue_when_nothing_fires():
    d = decide(PLAN, state(), signals())
    assert d.action == "continue" and d.next_phase is None and "on track" in d.reason


def test_roll_back_on_spike_or_nan_beats_everything():
    for bad in (FLAT + (9.0,), FLAT + (math.nan,)):
        # even with a budget cut, exhausted data and new hardware all at once
        d = decide(PLAN, state(), signals(left={"dclm": 0}, budget=11 * M, hw=("v4-1536",), losses=bad))
        assert d.action == "roll_back" and "ckpt/step-100" in d.reason and d.next_phase == KESTREL


def test_loss_spike_detector():
    assert loss_spike(FLAT + (2.02,)) is None
    assert "mean" in loss_spike(FLAT + (2.5,), sigma=6)
    assert loss_spike((1.0, 9.0)) is None  # too little history to judge
    assert "inf" in loss_spike((1.0, math.inf))


def test_budget_cut_cools_down_exactly_within_budget():
    d = decide(PLAN, state(trained=95 * M), signals(budget=100 * M))
    assert d.action == "cool_down" and "budget cut" in d.reason
    nxt = d.next_phase
    assert nxt.schedule == "linear_decay" and nxt.token_budget == 5 * M and nxt.is_cooldown
    assert nxt.warm_start_from == "kestrel" and nxt.name == "ocelot"
    assert nxt.mixture["flan"] == pytest.approx(0.15) and nxt.mixture["wiki"] == pytest.approx(0.15)
    assert nxt.mixture["dclm"] == pytest.approx(0.7 * 0.7)
    assert nxt.z_loss is None  # first cooldown: no z-loss


def test_budget_cut_during_cooldown_retimes_it():
    cd = dataclasses.replace(KESTREL, name="jellyfish", schedule="linear_decay", is_cooldown=True, token_budget=10 * M)
    d = decide(PLAN, state(phase=cd, phase_tokens=5 * M, trained=50 * M, done=("kestrel",)), signals(budget=52 * M))
    assert d.action == "cool_down" and "re-time" in d.reason
    assert d.next_phase.token_budget == 2 * M
    assert d.next_phase.start_fraction == pytest.approx(1.0 + (0.05 - 1.0) * 0.5)  # continues from where LR is


def test_stop_when_budget_spent():
    d = decide(PLAN, state(phase_tokens=100 * M, trained=100 * M), signals(budget=100 * M))
    assert d.action == "stop" and d.next_phase is None
    # a running phase that no longer fits and no room for even a minimal cooldown
    d = decide(PLAN, state(trained=99_500_000), signals(budget=100 * M))
    assert d.action == "stop"


def test_data_running_out_cools_down_with_high_quality_data():
    left = dict(PLENTY, dclm=1 * M, starcoder=1 * M, proofpile=1 * M)
    d = decide(PLAN, state(), signals(left=left))
    assert d.action == "cool_down" and "data running out" in d.reason and "30% high-quality" in d.reason
    assert d.next_phase.token_budget == 10 * M
    assert sum(d.next_phase.mixture.values()) == pytest.approx(1.0)


def test_change_mix_when_one_source_is_exhausted():
    d = decide(PLAN, state(), signals(left=dict(PLENTY, proofpile=0)))
    assert d.action == "change_mix" and "proofpile" in d.reason
    assert set(d.next_phase.mixture) == {"dclm", "starcoder"}
    assert d.next_phase.mixture["dclm"] == pytest.approx(0.7 / 0.9)
    assert d.next_phase.warm_start_from == "kestrel"


def test_migrate_scales_batch_and_lr_by_sqrt_rule():
    d = decide(PLAN, state(), signals(hw=("v4-256", "v4-1536")))
    assert d.action == "migrate" and "sqrt rule" in d.reason
    nxt = d.next_phase
    assert nxt.hardware == "v4-1536" and nxt.batch_size == 1536
    assert nxt.peak_lr == pytest.approx(1e-3 * math.sqrt(1.5))
    assert decide(PLAN, state(), signals(hw=("v4-256",))).action == "continue"  # smaller: stay


def test_planned_cooldown_when_stable_phase_ends():
    d = decide(PLAN, state(phase_tokens=100 * M), signals())
    assert d.action == "cool_down" and "reached its token budget" in d.reason


def test_priorities_between_simultaneous_signals():
    low = dict(PLENTY, dclm=1 * M, starcoder=1 * M, proofpile=0)
    # budget cut beats data running out, which beats change_mix and migrate
    assert decide(PLAN, state(trained=95 * M), signals(left=low, budget=100 * M, hw=("v4-1536",))).reason.startswith("budget cut")
    assert "data running out" in decide(PLAN, state(), signals(left=low, hw=("v4-1536",))).reason
    assert decide(PLAN, state(), signals(left=dict(PLENTY, proofpile=0), hw=("v4-1536",))).action == "change_mix"


def test_tootsie_sequence_kestrel_jellyfish_phoenix_starling():
    """Kestrel -> (source runs out) Jellyfish -> (budget raised) Phoenix -> (budget cut) Starling."""
    plan = dataclasses.replace(PLAN, phase_names=("kestrel", "jellyfish", "phoenix", "starling"))
    log = []
    # Kestrel trains; DCLM runs low at 80M tokens
    st = state(phase_tokens=80 * M, trained=80 * M)
    left = dict(PLENTY, dclm=1 * M, starcoder=2 * M, proofpile=1 * M)
    d = decide(plan, st, signals(left=left, budget=100 * M))
    log.append(d)
    jelly = d.next_phase
    assert (d.action, jelly.name, jelly.warm_start_from) == ("cool_down", "jellyfish", "kestrel")
    assert jelly.mixture["flan"] + jelly.mixture["wiki"] == pytest.approx(0.3)
    # Jellyfish finishes its cooldown; meanwhile the budget was raised
    st = RunState(phase=jelly, phase_tokens=jelly.token_budget, tokens_trained=90 * M, phases_done=("kestrel",), cooldowns_done=0)
    d = decide(plan, st, signals(left=dict(left, flan=10 * M), budget=400 * M))
    log.append(d)
    phoenix = d.next_phase
    assert (d.action, phoenix.name, phoenix.warm_start_from) == ("re_warm", "phoenix", "jellyfish")
    assert phoenix.warmup_start_fraction == 0.05 and phoenix.schedule == "wsd"
    assert set(phoenix.mixture) == {"nemotron", "starcoder", "flan"} and not phoenix.is_cooldown
    # Phoenix runs; the budget is cut: second cooldown, with z-loss
    st = RunState(
        phase=phoenix, phase_tokens=20 * M, tokens_trained=110 * M, phases_done=("kestrel", "jellyfish"), cooldowns_done=1
    )
    d = decide(plan, st, signals(left=dict(left, flan=8 * M), budget=120 * M))
    log.append(d)
    starling = d.next_phase
    assert (d.action, starling.name, starling.warm_start_from) == ("cool_down", "starling", "phoenix")
    assert starling.z_loss == 1e-4 and "z-loss" in d.reason and starling.token_budget == 10 * M
    # Starling ends at the budget: stop
    st = RunState(
        phase=starling,
        phase_tokens=10 * M,
        tokens_trained=120 * M,
        phases_done=("kestrel", "jellyfish", "phoenix"),
        cooldowns_done=1,
    )
    d = decide(plan, st, signals(budget=120 * M))
    log.append(d)
    assert [x.action for x in log] == ["cool_down", "re_warm", "cool_down", "stop"]
    assert all(x.reason for x in log)


def test_every_action_is_reachable():
    seen = {
        decide(PLAN, state(), signals()).action,
        decide(PLAN, state(), signals(losses=FLAT + (50.0,))).action,
        decide(PLAN, state(trained=95 * M), signals(budget=100 * M)).action,
        decide(PLAN, state(), signals(left=dict(PLENTY, proofpile=0))).action,
        decide(PLAN, state(), signals(hw=("v4-1536",))).action,
        decide(PLAN, state(phase_tokens=100 * M, trained=100 * M), signals(budget=100 * M)).action,
    }
    cd = dataclasses.replace(KESTREL, name="jellyfish", is_cooldown=True, schedule="linear_decay", token_budget=M)
    seen.add(decide(PLAN, state(phase=cd, phase_tokens=M, done=("kestrel",)), signals()).action)
    seen.add(decide(PLAN, state(), signals(band=BandSignal("loss left the band", "hold"))).action)
    seen.add(decide(SWITCHING, after(rollbacks=2), signals(losses=FLAT + (50.0,))).action)
    assert seen == set(ACTIONS)


def test_decide_is_pure():
    st, sg = state(), signals(left=dict(PLENTY, proofpile=0))
    assert decide(PLAN, st, sg) == decide(PLAN, st, sg)
    assert st == state() and sg.tokens_left["proofpile"] == 0


def test_invalid_plan_inputs_are_rejected():
    with pytest.raises(ValueError, match="schedule"):
        dataclasses.replace(KESTREL, schedule="exp")
    with pytest.raises(ValueError, match="ladder"):
        dataclasses.replace(PLAN, hardware_ladder={"tpu": 1.0})
    with pytest.raises(ValueError, match="budget_tokens"):
        Signals(tokens_left={}, budget_tokens=-1)


def test_phase_train_config_turns_a_spec_into_a_train_config():
    from marin_assets.train.config import TrainConfig

    base = TrainConfig(seq_len=64)
    spec = dataclasses.replace(
        KESTREL,
        name="starling",
        schedule="linear_decay",
        token_budget=64 * 8 * 10,
        batch_size=8,
        z_loss=1e-3,
        mixture={"a": 1.0},
        peak_lr=2e-3,
    )
    cfg = phase_train_config(base, spec)
    assert cfg.num_steps == 10 and cfg.batch_size == 8 and cfg.phase == "starling"
    assert cfg.schedule.kind == "linear_decay" and cfg.schedule.peak_lr == 2e-3 and cfg.model.lm_z_loss == 1e-3


@pytest.mark.parametrize(
    "change,message",
    [
        ({"peak_lr": float("nan")}, "PhaseSpec.peak_lr must be finite"),
        ({"peak_lr": float("inf")}, "PhaseSpec.peak_lr must be finite"),
        ({"z_loss": float("nan")}, "PhaseSpec.z_loss must be finite"),
        ({"mixture": {"web": float("nan")}}, "PhaseSpec kestrel: mixture stage at step 0: weight of 'web' must be finite"),
        ({"mixture": {"web": 0.0}}, "weights sum to zero"),
        ({"batch_size": 8.0}, "PhaseSpec.batch_size must be int"),
    ],
)
def test_phase_spec_rejects_non_finite_and_bad_mixes(change, message):
    import dataclasses

    with pytest.raises(ValueError, match=message):
        dataclasses.replace(KESTREL, **change)


def test_phase_mix_is_the_trainers_mixture():
    from marin_assets.datakit.mixture import Mixture
    from marin_assets.train.config import TrainConfig

    spec = PhaseSpec(
        name="a",
        warm_start_from=None,
        schedule="wsd",
        mixture={"web": 3, "code": 1},
        batch_size=8,
        hardware="cpu",
        token_budget=64 * 8 * 100,
        peak_lr=1e-3,
    )
    config = phase_train_config(TrainConfig(), spec)
    assert config.mixture == spec.data_mixture == Mixture.constant({"code": 0.25, "web": 0.75})
    assert normalise({"web": 3, "code": 1, "math": 0}) == {"code": 0.25, "web": 0.75}


# ---- mid-phase: end_phase_now on live signals ------------------------------------------------


def test_end_phase_now_on_a_cut_below_what_the_phase_needs():
    from marin_assets.phases import end_phase_now

    live = dataclasses.replace(state(phase_tokens=40 * M, trained=40 * M), step=400)
    # the phase needs 60M more; 60M left is enough, 59M is a cut
    assert end_phase_now(PLAN, live, signals(budget=100 * M)) is None
    reason = end_phase_now(PLAN, live, signals(budget=99 * M))
    assert reason == "budget cut at step 400 to 99,000,000 tokens: 59,000,000 left but kestrel needs 60,000,000 more"
    # a finished phase is left to end by itself
    done = dataclasses.replace(live, phase_tokens=100 * M, tokens_trained=100 * M)
    assert end_phase_now(PLAN, done, signals(budget=50 * M)) is None


def test_end_phase_now_on_a_spike_and_decide_rolls_back_the_ended_phase():
    from marin_assets.phases import end_phase_now

    live = dataclasses.replace(state(), step=120)
    assert end_phase_now(PLAN, live, signals(losses=FLAT + (2.02,))) is None
    reason = end_phase_now(PLAN, live, signals(losses=FLAT + (9.0,)))
    assert reason.startswith("loss spike at step 120: loss 9")
    # the phase stopped two steps later, when the losses had calmed: still a roll-back
    ended = dataclasses.replace(live, step=122, ended_early=reason)
    d = decide(PLAN, ended, signals(losses=FLAT))
    assert d.action == "roll_back" and d.reason.startswith("loss spike: loss spike at step 120")
    assert decide(PLAN, dataclasses.replace(live, step=122), signals(losses=FLAT)).action == "continue"


def test_a_phase_ended_by_a_cut_cools_down_and_the_reason_names_the_step():
    ended = dataclasses.replace(
        state(phase_tokens=40 * M, trained=40 * M), step=402, ended_early="budget cut at step 400 to 50,000,000 tokens"
    )
    d = decide(PLAN, ended, signals(budget=50 * M))
    assert d.action == "cool_down" and d.next_phase.token_budget == 10 * M
    assert d.reason.startswith("budget cut: kestrel ended early at step 402 (budget cut at step 400")
    plain = decide(PLAN, dataclasses.replace(ended, ended_early=None), signals(budget=50 * M))
    assert plain.reason.startswith("budget cut: 10,000,000 tokens left but kestrel needs 60,000,000 more")


def test_phase_telemetry_run_names_are_validated():
    from marin_assets.phases import phase_telemetry_run

    assert phase_telemetry_run("demo", "phoenix") == "demo-phoenix"
    with pytest.raises(ValueError, match="telemetry run"):
        phase_telemetry_run("demo", "../x")


def test_planned_cooldown_is_capped_at_the_budget_left():
    # kestrel has used its 100M, but only 3M of the budget is left: a 10M cooldown would overrun it
    d = decide(PLAN, state(phase_tokens=100 * M, trained=97 * M), signals(budget=100 * M))
    assert d.action == "cool_down" and "reached its token budget" in d.reason
    assert d.next_phase.token_budget == 3 * M and "over 3,000,000 tokens" in d.reason
    # with room to spare the plan's own cooldown length stands
    assert decide(PLAN, state(phase_tokens=100 * M, trained=100 * M), signals()).next_phase.token_budget == 10 * M


def test_data_running_out_cooldown_is_capped_at_the_budget_left():
    left = dict(PLENTY, dclm=1 * M, starcoder=1 * M, proofpile=1 * M)
    # kestrel still needs 3M and 4M of the budget is left: no budget cut, but the 10M cooldown must shrink to 4M
    d = decide(PLAN, state(phase_tokens=97 * M, trained=96 * M), signals(left=left, budget=100 * M))
    assert d.action == "cool_down" and "data running out" in d.reason and d.next_phase.token_budget == 4 * M


def test_rewarm_is_capped_at_the_budget_left():
    cd = dataclasses.replace(KESTREL, name="jellyfish", schedule="linear_decay", is_cooldown=True, token_budget=10 * M)
    st = state(phase=cd, phase_tokens=10 * M, trained=110 * M, done=("kestrel",))
    d = decide(PLAN, st, signals(budget=130 * M))
    assert d.action == "re_warm" and d.next_phase.token_budget == 20 * M  # the plan's 50M does not fit
    assert decide(PLAN, st, signals(budget=1000 * M)).next_phase.token_budget == 50 * M


# ---- the ladder watch's signal (marin_assets/scaling/trajectory.py, sensors/ladder_watch.py) ---

OFF = "loss left the ladder's band at step 12: 7.1 > 5.8"


def test_band_signal_rollback_restarts_the_phase_like_a_spike():
    d = decide(PLAN, state(), signals(band=BandSignal(OFF, "rollback", 12)))
    assert d.action == "roll_back" and d.next_phase == KESTREL
    assert d.reason == f"off the ladder's band: {OFF}; restart kestrel from ckpt/step-100"


def test_band_signal_hold_requests_no_next_phase_even_when_one_is_due():
    hold = BandSignal(OFF, "hold", 12)
    # kestrel used its tokens: without the signal the plan cools down
    assert decide(PLAN, state(phase_tokens=100 * M), signals()).action == "cool_down"
    d = decide(PLAN, state(phase_tokens=100 * M), signals(band=hold))
    assert d.action == "hold" and d.next_phase is None
    assert d.reason.startswith(f"off the ladder's band: {OFF}; no next phase until")
    assert "released_holds names kestrel" in d.reason
    # a spent budget still stops (nothing would be requested anyway); a spike still rolls back
    assert decide(PLAN, state(phase_tokens=100 * M, trained=100 * M), signals(budget=100 * M, band=hold)).action == "stop"
    assert decide(PLAN, state(), signals(losses=FLAT + (50.0,), band=hold)).action == "roll_back"


def test_band_signal_warn_changes_no_decision():
    for st in (state(), state(phase_tokens=100 * M)):
        assert decide(PLAN, st, signals(band=BandSignal(OFF, "warn", 12))) == decide(PLAN, st, signals())


def test_end_phase_now_ends_on_a_rollback_band_signal_and_decide_rolls_the_ended_phase_back():
    from marin_assets.phases import end_phase_now

    live = dataclasses.replace(state(), step=40)
    for action in ("hold", "warn"):
        assert end_phase_now(PLAN, live, signals(band=BandSignal(OFF, action, 12))) is None
    reason = end_phase_now(PLAN, live, signals(band=BandSignal(OFF, "rollback", 12)))
    assert reason == f"off the ladder's band at step 40: {OFF}"
    # stopped two steps later; the finished phase's own verdict is gone (e.g. not judged): still a roll-back
    ended = dataclasses.replace(live, step=42, ended_early=reason)
    d = decide(PLAN, ended, signals())
    assert d.action == "roll_back" and d.reason.startswith(f"off the ladder's band at step 40: {OFF}; restart kestrel")


def test_band_signal_names_a_known_action():
    with pytest.raises(ValueError, match="BandSignal.action must be one of"):
        BandSignal(OFF, "pause")


def test_the_budget_file_lists_released_holds(tmp_path):
    from marin_assets.train.budget import Budget, load_budget, write_budget

    path = tmp_path / "budget.yaml"
    write_budget(path, Budget(budget_tokens=10, released_holds=("kestrel",)))
    assert load_budget(path).released_holds == ("kestrel",)
    path.write_text("budget_tokens: 10\nreleased_holds: kestrel\n")
    with pytest.raises(ValueError, match=f"budget file {path}: released_holds must be a list of phase names"):
        load_budget(path)
    path.write_text("budget_tokens: 10\nreleased_holds: [3]\n")
    with pytest.raises(ValueError, match=f"budget file {path}: released_holds must be a list of phase names"):
        load_budget(path)


# ---- the architecture switch and the MoE drop-rate signal -----------------------------------

SWITCHING = dataclasses.replace(
    PLAN,
    architecture_switch=ArchitectureSwitch(
        mapping="qk_norm", model_changes={"qk_norm": True}, after_rollbacks=2, warmup_start_fraction=0.1
    ),
)
OCELOT = dataclasses.replace(KESTREL, name="ocelot", warm_start_from="kestrel", model_changes={"qk_norm": False})
SPIKE = FLAT + (50.0,)


def after(rollbacks=0, switches=(), phase=OCELOT):
    """Ocelot, warm-started from kestrel, after ``rollbacks`` roll-backs."""
    return RunState(
        phase=phase,
        phase_tokens=10 * M,
        tokens_trained=110 * M,
        phases_done=("kestrel",),
        last_good_checkpoint="kestrel",
        rollbacks=rollbacks,
        switches_done=switches,
    )


def test_switch_architecture_after_the_planned_roll_backs_not_before():
    for n in (0, 1):
        d = decide(SWITCHING, after(rollbacks=n), signals(losses=SPIKE))
        assert d.action == "roll_back" and d.next_phase == OCELOT
    d = decide(SWITCHING, after(rollbacks=2), signals(losses=SPIKE))
    assert d.action == "switch_architecture"
    assert d.reason.startswith("loss spike: loss 50 > mean") and "2 roll-back(s) of ocelot did not cure it" in d.reason
    assert "qk_norm architecture (qk_norm=True) as jellyfish from kestrel" in d.reason
    nxt = d.next_phase
    # the phase again under a new name, from the same last good checkpoint, on the switched model
    assert nxt.name == "jellyfish" and nxt.warm_start_from == "kestrel" and nxt.transplant == "qk_norm"
    assert nxt.model_changes == {"qk_norm": True} and nxt.warmup_start_fraction == 0.1
    assert nxt.token_budget == OCELOT.token_budget and nxt.mixture == OCELOT.mixture


def test_switch_architecture_is_made_once():
    switched = dataclasses.replace(OCELOT, name="jellyfish", transplant="qk_norm", model_changes={"qk_norm": True})
    for rollbacks in (2, 5):
        d = decide(SWITCHING, after(rollbacks, switches=("qk_norm",), phase=switched), signals(losses=SPIKE))
        # the switched phase is rolled back as it is: the same transplant from the same checkpoint
        assert d.action == "roll_back" and d.next_phase == switched


def test_no_switch_without_a_plan_for_it_on_the_first_phase_or_on_the_band():
    assert decide(PLAN, after(rollbacks=9), signals(losses=SPIKE)).action == "roll_back"
    first = RunState(phase=KESTREL, phase_tokens=M, tokens_trained=M, rollbacks=9)
    assert decide(SWITCHING, first, signals(losses=SPIKE)).action == "roll_back"  # nothing before it to carry over
    band = BandSignal("loss left the band", "rollback")
    assert decide(SWITCHING, after(rollbacks=9), signals(band=band)).action == "roll_back"


def test_phases_after_a_switch_keep_its_model_and_transplant_nothing():
    switched = dataclasses.replace(OCELOT, name="jellyfish", transplant="qk_norm", model_changes={"qk_norm": True})
    at_end = RunState(phase=switched, phase_tokens=100 * M, tokens_trained=200 * M, phases_done=("kestrel", "ocelot"))
    cut = dataclasses.replace(at_end, phase_tokens=10 * M, tokens_trained=110 * M)
    for d in (
        decide(SWITCHING, at_end, signals()),  # planned cooldown
        decide(SWITCHING, cut, signals(left=dict(PLENTY, proofpile=0))),  # change_mix
        decide(SWITCHING, cut, signals(hw=("v4-1536",))),
    ):  # migrate
        assert d.next_phase.model_changes == {"qk_norm": True} and d.next_phase.transplant is None, d.action
        assert d.next_phase.warm_start_from == "jellyfish" and d.next_phase.name == "phoenix"


def test_phase_train_config_applies_the_model_changes():
    from marin_assets.train.config import TrainConfig

    spec = dataclasses.replace(
        OCELOT, token_budget=64 * 8 * 10, batch_size=8, z_loss=1e-3, model_changes={"qk_norm": False, "n_routed_experts": 0}
    )
    cfg = phase_train_config(TrainConfig(seq_len=64), spec)
    assert cfg.model.qk_norm is False and cfg.model.n_routed_experts == 0 and cfg.model.lm_z_loss == 1e-3
    assert phase_train_config(TrainConfig(seq_len=64), KESTREL).model.qk_norm is True


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: dataclasses.replace(OCELOT, model_changes={"qk_nrom": True}), "model_changes names 'qk_nrom', which is not"),
        (
            lambda: dataclasses.replace(OCELOT, model_changes={"init_std": math.nan}),
            r"model_changes\['init_std'\] must be a finite",
        ),
        (lambda: dataclasses.replace(KESTREL, transplant="qk_norm"), "transplant 'qk_norm' needs a warm_start_from"),
        (lambda: ArchitectureSwitch(mapping="llama", model_changes={"qk_norm": True}), "mapping 'llama' is not one of"),
        (
            lambda: ArchitectureSwitch(mapping="qk_norm", model_changes={"qk_norm": True}, warmup_start_fraction=math.inf),
            "warmup_start_fraction must be finite",
        ),
        (lambda: ArchitectureSwitch(mapping="qk_norm", model_changes={}), "must be a non-empty mapping"),
        (lambda: dataclasses.replace(PLAN, max_drop_rate=math.nan), "max_drop_rate must be finite"),
        (lambda: dataclasses.replace(PLAN, max_drop_rate=1.5), r"max_drop_rate must be a finite fraction in \[0, 1\]"),
    ],
)
def test_architecture_and_drop_rate_settings_are_checked(make, message):
    with pytest.raises(ValueError, match=message):
        make()


DROPPY = dataclasses.replace(PLAN, max_drop_rate=0.2)


def test_drop_rate_above_the_plan_limit_holds_the_run():
    high = (0.1,) * 8 + (0.5,) * 24  # mean 0.4 over the last 32 steps
    d = decide(DROPPY, state(phase_tokens=100 * M), signals(left=dict(PLENTY, proofpile=0), drops=high))
    assert d.action == "hold" and d.next_phase is None
    assert d.reason == (
        "MoE drop rate 40.00% (mean of the last 32 steps) > max_drop_rate 20.00%; no next phase until the "
        "budget file's released_holds names kestrel"
    )


def test_drop_rate_signal_stays_quiet_below_the_limit_without_the_column_or_a_limit():
    due = state(phase_tokens=100 * M)  # the planned cooldown is due
    assert decide(DROPPY, due, signals(drops=(0.9,) + (0.1,) * 32)).action == "cool_down"  # old blip
    assert decide(DROPPY, due, signals(drops=(math.nan, math.inf))).action == "cool_down"
    assert decide(DROPPY, due, signals()).action == "cool_down"  # no moe/drop_rate column: no signal
    assert decide(PLAN, due, signals(drops=(0.9,) * 32)).action == "cool_down"  # no limit set


def test_a_spike_and_a_spent_budget_still_beat_the_drop_rate_hold():
    high = (0.9,) * 32
    assert decide(DROPPY, state(), signals(losses=SPIKE, drops=high)).action == "roll_back"
    assert decide(DROPPY, state(phase_tokens=100 * M, trained=100 * M), signals(budget=100 * M, drops=high)).action == "stop"


def test_drop_rate_alarm_reads_the_mean_of_the_finite_recent_values():
    assert drop_rate_alarm((), 0.1) is None
    assert drop_rate_alarm((0.3, math.nan, 0.1), 0.1, window=3) == (
        "MoE drop rate 20.00% (mean of the last 2 steps) > max_drop_rate 10.00%"
    )
    assert drop_rate_alarm((0.3, 0.1, 0.1), 0.2, window=3) is None
    assert drop_rate_alarm((0.9, 0.1, 0.1), 0.2, window=2) is None  # outside the window

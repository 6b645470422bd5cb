"""`spade status`: what the running daemon is doing, as one line per part of the loop (or the
same as JSON). The figures come from status_read; this module only renders them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, config_or_exit, fail
from spade_async.cli.status_read import design_moves, read_status, status_path
from spade_async.core.config import SpadeConfig


def show_status(config: Path = ConfigOpt, as_json: bool = JsonOpt) -> None:
    """What the running daemon is doing (read from its status file)."""
    cfg = config_or_exit(config)
    try:
        st = read_status(cfg)
    except FileNotFoundError:
        raise fail(f"no daemon status at {status_path(cfg)}: has `spade run` been started "
                   "with this config?") from None
    if as_json:
        typer.echo(json.dumps(st, indent=2))
        return
    typer.echo("\n".join(_status_lines(st, cfg)) + "\n")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _saturation_text(run: dict | None) -> str:
    """The run's mean saturation, split by whether the daemon waited for the trainer."""
    if not run or run.get("mean") is None:
        return ""
    out = f"; run mean {run['mean']:.0%}"
    if run.get("trainer_wait_share"):
        running = "-" if run.get("running") is None else f"{run['running']:.0%}"
        out += (f" ({running} while not waiting for the trainer, which it did "
                f"{run['trainer_wait_share']:.0%} of the time)")
    return out


def _status_lines(st: dict, cfg: SpadeConfig) -> list[str]:
    """`spade status` at a glance: one line per part of the loop."""
    c, t = st.get("counters", {}), st["trainer"]
    state = "running" if st["running"] else ("stopped" if st.get("stopped") else "not running")
    if st.get("stop_reason") and not st["running"]:
        state += f" ({st['stop_reason']})"
    lines = [f"daemon     pid {st.get('pid')} {state}, up {_duration(st.get('uptime_s'))}, "
             f"status {st['age_s']}s old, {st.get('iterations')} documents done"]
    lines.append(f"policy     in use v{st.get('policy_version')} ({st.get('model')}), published "
                 f"v{t['published_version']}, this run started on v{st.get('start_version', 0)}")
    for ep in st.get("endpoints", []):
        mean = ep.get("saturation_mean_60s")
        lines.append(f"endpoint   {ep['name']} {'up' if ep['up'] else 'DOWN'} {ep['base_url']}: "
                     f"{ep['in_flight']}/{ep['max_concurrency']} in flight "
                     f"({ep['saturation']:.0%} now"
                     + (f", {mean:.0%} mean over 60 s" if mean is not None else "")
                     + f"), swap {ep['weight_swap']}"
                     + (f", {1 / (ep['s_per_token_p90'] * ep['max_concurrency']):.1f} tok/s per "
                        "request at full load (p90)" if ep.get("s_per_token_p90") else "")
                     + (f", {ep['server']} ({'+'.join(ep['paths']) or 'no path'})"
                        if ep.get("server") else "")
                     + (f", rate-limited {ep['rate_limited_s']:g} s more"
                        if ep.get("rate_limited_s") else "")
                     + _saturation_text(ep.get("saturation_run")))
    roles = st.get("roles") or {}
    if any(r.get("group") != "default" or r.get("model") for r in roles.values()):
        lines.append("roles      " + "; ".join(
            f"{name} {r['group']}/{r['path']} ({r['model'] or 'the policy'}"
            + (", frozen: not trained on" if name == "designer" and not r["trained"] else "")
            + ")" for name, r in roles.items()))
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(st.get("rejection_reasons", {}).items(),
                                                      key=lambda kv: -kv[1]))
    rejected = c.get("designs_invalid", 0) + c.get("designs_duplicate", 0)
    lines.append(f"designs    {c.get('designs', 0)} proposed: {c.get('designs_accepted', 0)} "
                 f"accepted, {rejected} rejected" + (f" ({reasons})" if reasons else ""))
    moves = st.get("moves") or design_moves(c)
    if moves is not None:
        from spade_async.report.curriculum import moves_text

        lines.append(f"moves      {moves_text(moves)}")
    lines.append(f"episodes   {c.get('episodes', 0)} ({c.get('episodes_unhinted', 0)} unhinted, "
                 f"{c.get('episodes_hinted', 0)} hinted, {c.get('episode_errors', 0)} errors), "
                 f"{c.get('tokens_sampled', 0)} tokens sampled, {c.get('replays', 0)} replays")
    if st.get("tokens"):
        lines.append(f"tokens     {_tokens_text(st['tokens'])}")
    f = st.get("failures") or {}
    by_kind, given_up = f.get("by_kind", {}), f.get("given_up", {})
    lines.append("failures   " + (", ".join(f"{k} {v}" for k, v in by_kind.items()) or "none")
                 + ("; given up: " + ", ".join(f"{k} {v}" for k, v in given_up.items())
                    if given_up else ""))
    r = st.get("regret", {})
    if r.get("n"):
        lines.append(f"regret     {r['n']} envs: mean {r['mean']}, p10 {r['p10']}, p50 "
                     f"{r['p50']}, p90 {r['p90']}, max {r['max']}; histogram over [0,1] "
                     f"{r.get('histogram')}")
    else:
        lines.append("regret     no environment played yet")
    if c.get("plays_leak_flagged") or c.get("episodes_hinted"):
        lines.append(f"hint leak  {c.get('plays_leak_flagged', 0)} plays flagged (hinted wins "
                     "copied from the hint; their designers' rewards discounted)")
    inf = st.get("in_flight", {})
    waiting = max(0, t["last_seq"] - t["taken_seq"])
    ahead = cfg.daemon.max_batches_ahead
    lines.append(f"queues     env queue {st.get('env_queue_depth', 0)}/{st.get('env_queue_size', '?')}"
                 f", spool {waiting} batches waiting for the trainer"
                 + (f" (max {ahead}{', the daemon waits' if st.get('waiting_for_trainer') else ''})"
                    if ahead else "")
                 + f"; in flight: designs {inf.get('designs', 0)}, validations "
                 f"{inf.get('validations', 0)}, episodes {inf.get('episodes', 0)}")
    adm = st.get("admission")
    if adm:
        groups = "; ".join(f"group {g} {x['busy']} requests busy + {x['starting']} starting "
                           f"of capacity {x['capacity']}" for g, x in adm["groups"].items())
        lines.append(f"admission  {adm['documents']} documents and {adm['plays']} plays in "
                     f"flight ({adm['episodes']} episodes of {cfg.sandbox.slots} sandbox slots), "
                     f"{adm['plays_waiting']} plays waiting; {groups}")
    trainer_stale = ((t.get("ledger") or {}).get("dropped") or {}).get("stale", 0)
    lines.append(f"batches    {c.get('batches', 0)} written ({c.get('samples', 0)} samples); "
                 f"dropped as stale: {c.get('samples_stale_dropped', 0)} by the daemon, "
                 f"{trainer_stale} by the trainer")
    lines.append(f"samples    {_samples_text(st.get('samples'))}")
    if c.get("evals") or c.get("eval_failures") or inf.get("evals"):
        lines.append(f"eval       {c.get('evals', 0)} versions evaluated, "
                     f"{c.get('eval_failures', 0)} failed, {inf.get('evals', 0)} running "
                     "(`spade eval`, results in `spade report`)")
    if t.get("step") is None:
        lines.append(f"trainer    no step yet; taken {t['taken_seq']} of {t['last_seq']} batches")
    else:
        lines.append(f"trainer    step {t['step']} ({t.get('last_event')} {t['last_event_age_s']}s"
                     f" ago), taken {t['taken_seq']} of {t['last_seq']} batches"
                     + _recent_steps_text(t.get("recent")) + f"; loss {t.get('loss')}, "
                     f"staleness {t.get('staleness_mean')}, |dlogp| vs vLLM "
                     f"{t.get('logprob_abs_diff_mean')}")
    return lines


def _counts(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))
                     if v)


def _samples_text(s: dict | None) -> str:
    """Played -> written -> trained, and every drop with its reason, on both sides."""
    if s is None:
        return "no sample ledger in the daemon's status (a daemon from before it was counted)"
    played = s["played"]
    by_daemon = "; ".join(f"{role}: {_counts(d)}" for role, d in s["dropped_by_daemon"].items()
                          if _counts(d))
    n_dropped = sum(sum(d.values()) for d in s["dropped_by_daemon"].values())
    out = (f"{sum(played.values())} played this daemon run ({played.get('agent', 0)} agent episodes, "
           f"{played.get('designer', 0)} designs): {s['written']} written to the spool, "
           f"{n_dropped} dropped by the daemon" + (f" ({by_daemon})" if by_daemon else "")
           + f", {s['in_flight']} in flight")
    tl = s.get("trainer")
    if tl is None:
        return out + f"; the trainer: nothing yet, {s['waiting_in_spool']} waiting in the spool"
    dropped = _counts(tl["dropped"])
    buffered = "?" if tl.get("buffered") is None else tl["buffered"]
    return (out + f"; the trainer (over its life): {tl['trained']} trained, "
            f"{sum(tl['dropped'].values())} dropped" + (f" ({dropped})" if dropped else "")
            + f", {buffered} buffered, {s['waiting_in_spool']} waiting in the spool")


def _rate(x: float | None, unit: str = " tok/s") -> str:
    return "-" if x is None else f"{x:.1f}{unit}"


def _tokens_text(tok: dict) -> str:
    """The loop's sampled tokens/s (designs and episodes) and its ratio to the bench."""
    roles = tok.get("roles", {})
    window = tok.get("window") or {}
    secs = f"{window.get('seconds', 0):.0f} s"
    out = (f"sampled {_rate(window.get('sampled_per_s'))} over the last {secs}, "
           f"{_rate(tok.get('sampled_per_s'), '')} over the run (designs "
           f"{roles.get('designer', {}).get('sampled', 0)}, episodes "
           f"{roles.get('agent', {}).get('sampled', 0)} tokens), prompt "
           f"{_rate(window.get('prompt_per_s'))}")
    ref = tok.get("bench") or {}
    if not ref.get("tokens_per_s"):
        return out + f"; {ref.get('missing', 'no bench result')}"
    when = (time.strftime("%Y-%m-%d", time.localtime(ref["measured_at"]))
            if ref.get("measured_at") else "?")
    ratio = [("-" if r is None else f"{r:.2f}x")
             for r in (tok.get("ratio_window"), tok.get("ratio_run"))]
    return (out + f"; {ratio[0]} (last {secs}), {ratio[1]} (run) of spade bench inference: "
            f"{ref['tokens_per_s']:.1f} tok/s, {ref.get('streams') or '?'} streams "
            f"{ref['what']}" + (f", x{ref['endpoints']} endpoints" if ref["endpoints"] > 1
                                else "") + f", measured {when}")


def _recent_steps_text(r: dict | None) -> str:
    """The trainer's last steps: samples per step, tokens/s, padded/real, KL to the base."""
    if not r:
        return ""
    kl = (f"KL to base {r['kl_base']:.4g}" if r.get("kl_base") is not None else
          f"|dlogp| to base {r['logprob_abs_diff_base']:.4g}"
          if r.get("logprob_abs_diff_base") is not None else "KL to base -")
    pad = "-" if r.get("padding_ratio") is None else f"{r['padding_ratio']:.2f}"
    per_hour = "" if r.get("steps_per_hour") is None else f", {r['steps_per_hour']:.1f} steps/h"
    spp = "-" if r.get("samples_per_step") is None else f"{r['samples_per_step']:g}"
    return (f"; last {r['steps']} steps: {spp} samples/step{per_hour}, "
            f"{_rate(r.get('tokens_per_s'))} trained ({_rate(r.get('seq_tokens_per_s'))} of "
            f"sequence), padded/real {pad}, {kl}")

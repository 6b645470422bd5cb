"""Where generated environment code runs and the acceptance checks it must pass there."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from spade_async.core.strict import Strict


class RaySandboxConfig(Strict):
    """`[sandbox.ray]`: sandbox nodes placed by Ray (`sandbox.placement = "ray"`). Each node
    that offers `node_resource` hosts `actors_per_node` actors; each actor runs the local
    sandbox (same worker protocol, same isolation layers, `sandbox.slots` slots of its own)."""

    address: str = Field("auto", description="the Ray cluster to join (ray.init's address): "
                         "'auto' finds the one this host runs in, or 'ray://host:10001' / "
                         "'host:6379'")
    namespace: str = Field("spade-sandbox", description="Ray namespace of the sandbox actors")
    node_resource: str = Field("spade_sandbox", description="custom resource that marks a "
                               "sandbox node (`ray start --resources '{\"spade_sandbox\": 1}'`); "
                               "empty: every alive node of the cluster")
    actors_per_node: int = Field(1, ge=1, le=64, description="sandbox actors per node, each "
                                 "with `sandbox.slots` slots (actor k runs its slots as uids "
                                 "uid_base + k * slots + i)")
    call_slack_s: float = Field(10.0, gt=0, description="seconds a remote call may take beyond "
                                "its sandbox deadline before the node counts as lost")
    start_timeout_s: float = Field(60.0, gt=0, description="deadline for a new actor to start "
                                   "its sandbox (process start, isolation probe)")
    refresh_s: float = Field(15.0, gt=0, description="how often the node list is read again "
                             "(new nodes get actors, dead actors on live nodes are replaced); "
                             "at once after a loss")
    session_idle_s: float = Field(900.0, gt=0, description="an actor closes a session nobody "
                                  "called for this long (a close lost with its caller)")


class SandboxConfig(Strict):
    """Where generated environment code runs (DESIGN §4). Every layer is on by default."""

    placement: Literal["local", "ray"] = Field(
        "local", description="local = workers on the daemon's host; ray = workers on the "
        "Ray cluster's sandbox nodes ([sandbox.ray]), through the same interface; a lost node's "
        "episodes fail as `sandbox_node_lost`, are retried elsewhere and never scored"
    )
    ray: RaySandboxConfig = Field(default_factory=RaySandboxConfig)
    isolation: Literal["auto", "bwrap", "unshare", "none"] = Field(
        "auto", description="auto = bwrap, else unshare (root); 'none' runs unisolated, loudly"
    )
    python: Path | None = Field(None, description="interpreter for workers; default: the "
                                "base interpreter of this Python (never a venv's)")
    slots: int = Field(8, ge=1, le=512, description="environment instances alive at once (with "
                       "placement = 'ray': per actor)")
    warm_workers: int = Field(4, ge=0, description="pre-started workers waiting for a load")
    uid_base: int = Field(61000, ge=1000, lt=1 << 31, description="first slot uid: a sandbox "
                          "claims the first block of `slots` uids from here that no other "
                          "sandbox on this host holds (lock files in /run/spade-sandbox-uids); "
                          "slot i runs as uid/gid block start + i")
    load_timeout_s: float = Field(10.0, gt=0, description="deadline of load (exec of the module)")
    call_timeout_s: float = Field(5.0, gt=0, description="deadline of one reset/step/hint call")
    start_timeout_s: float = Field(10.0, gt=0, description="deadline for a worker to be ready")
    max_response_bytes: int = Field(1 << 20, ge=4096, description="cap on one reply's size")
    address_space_mb: int = Field(1024, ge=64, description="RLIMIT_AS per worker process")
    memory_mb: int = Field(512, ge=32, description="cgroup memory limit per slot (with /tmp)")
    cpu_seconds: int = Field(60, ge=1, description="RLIMIT_CPU per worker (a whole episode)")
    file_size_mb: int = Field(8, ge=1, description="RLIMIT_FSIZE")
    tmp_size_mb: int = Field(16, ge=1, description="size of the private /tmp")
    open_files: int = Field(64, ge=16, description="RLIMIT_NOFILE")
    processes: int = Field(16, ge=2, description="RLIMIT_NPROC per slot uid, cgroup pids.max")
    max_code_bytes: int = Field(64_000, ge=1000, description="static check: module size limit")


class ValidationConfig(Strict):
    """The acceptance checks of DESIGN §3 run on every proposed environment."""

    seeds: list[int] = Field([0, 1, 2], min_length=1, description="seeds for every sandbox check")
    extreme_seeds: int = Field(1, ge=1, description="how many of `seeds` the checks use at an "
                               "environment's knob extremes (all of them at the defaults and at a "
                               "proposed variant): up to 16 extra points, so they cost ~1/3 each")
    exploit_threshold: float = Field(0.5, gt=0, le=1, description="a probe policy scoring this "
                                     "much means the environment is trivially exploitable")
    solution_score: float = Field(1.0, gt=0, le=1, description="score the solution must reach")
    echo_probes: bool = Field(True, description="play the observation echoes (probes that send "
                              "an item read off each turn's observation) at the defaults")
    decoded_hints: bool = Field(True, description="play the answers the hint gives in another "
                                "form (number words, reversed, in pieces, spelled-out "
                                "arithmetic, other notations) as hint-leak policies")
    reader: bool = Field(True, description="the model check of the hint (hint_reader): once "
                         "the cheap checks pass, the policy model is asked for the answer with "
                         "the hint and without, at a few tokens a reply; a hint that lifts its "
                         "solve rate by `reader_threshold` gives the answer away. Run on new "
                         "designs (an edit's variant shares its environment's hint code)")
    reader_tokens: int = Field(24, ge=1, le=512, description="tokens a hint-reader reply may "
                               "use: an answer, no room to reason")
    reader_turns: int = Field(3, ge=1, description="turns the hint reader plays at most")
    reader_threshold: float = Field(0.5, gt=0, le=1, description="hinted minus unhinted solve "
                                    "rate of the hint reader that rejects the hint as a leak")

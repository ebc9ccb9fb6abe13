"""What the workers and the auditor agree on: the manager's settings, the pools, and the bounds
the README states for each fault (every window below is derived from these settings)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class BudgetLevel:
    """One level every budgeted stream spends, counted in its own unit: a policy ``name`` with
    ``limit`` units per ``budget_per`` seconds, for the identity ``identity_of(user)`` gives (the
    user's own when it gives the user), ``per_token`` units for each answer token."""

    name: str
    unit: str
    limit: int
    per_token: int
    identity_of: Callable[[str], str]


@dataclass(frozen=True)
class Settings:
    key_prefix: str = "chaos"
    identity_secret: str = "chaos-identity-secret-0123456789"
    lease_seconds: float = 2.0
    renew_every: float = 2.0 / 3.0
    redis_timeout: float = 0.5
    max_per_user: int = 3
    max_global: int = 24
    users: int = 12
    resources: dict[str, int] = field(default_factory=lambda: {"gpu": 4, "db": 8})
    # Stream runners per worker process (each opens one stream after another).
    concurrency: int = 12
    # Most streams last up to 3 s; one in five up to 10 s, longer than every window the
    # auditor allows, so a stream wrongly kept (or taken back) after a fault is seen over a cap.
    short_stream: float = 3.0
    long_stream: float = 10.0
    # A share of the streams with a user also counts a per-user start rate, and a share spends
    # a per-user token budget as it streams (chunks of 1 to ``max_chunk`` tokens): limits tight
    # enough to refuse and to cut now and then, so the auditor's window checks have work.
    rate_share: float = 0.4
    rate_limit: int = 3
    rate_per: float = 2.0
    budget_share: float = 0.5
    budget: int = 800
    budget_per: float = 4.0
    max_chunk: int = 60
    # Besides the streams, ``hitters`` tasks per worker hit a request rate whose units each
    # worker leases (``RateLimit(lease_units=True)``): one of ``hit_users`` hot users at a time,
    # pausing up to ``hit_pause`` seconds between hits, against ``hit_limit`` per ``hit_per``
    # seconds, so most hits are served from units a worker took ahead and many are refused.
    hitters: int = 2
    hit_users: int = 3
    hit_limit: int = 40
    hit_per: float = 1.0
    hit_pause: float = 0.02
    # The budgeted streams also spend their team's budget in money (``unit="cost"``, one model
    # at ``answer_price`` units per million answer tokens), shared by the team's users: the users
    # are spread over ``teams`` teams, each with less than its users' budgets together, so the
    # team's level refuses and cuts too.
    teams: int = 3
    team_budget: int = 4_000
    model: str = "chaos-model"
    answer_price: int = 2_000_000
    # ``lease_global_slots``: each worker takes the global pool's slots in slabs, the users' keys
    # have tags of their own, and no stream takes resources with a user.
    lease_global_slots: bool = False
    # The workers run on the 3-master cluster (one script call takes keys of one hash tag only).
    cluster: bool = False

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Settings:
        return cls(**data)  # type: ignore[arg-type]

    def team_of(self, user: str) -> str:
        return f"team{int(user.removeprefix('user')) % self.teams}"

    def budget_levels(self) -> list[BudgetLevel]:
        """The levels of a budgeted stream's acquire: its user's tokens and its team's money.
        Under ``lease_global_slots`` on a cluster, the user's tokens only: the team's counter is
        in the team's own tag, and the library refuses an acquire whose counters span tags
        there."""
        levels = [BudgetLevel("tokens", "tokens", self.budget, 1, lambda user: user)]
        if not self.tags_per_user_on_cluster:
            levels.append(BudgetLevel("team_spend", "cost", self.team_budget,
                                      self.answer_price // 1_000_000, self.team_of))
        return levels

    @property
    def tags_per_user_on_cluster(self) -> bool:
        """Whether the run's keys spread over the cluster's nodes: each user's in a tag of its
        own, which any master may hold, and no script reads two tags."""
        return self.lease_global_slots and self.cluster

    # -- the key layout of docs/design.md, section 3 (global_pool=True, and lease_global_slots) --

    @property
    def tag(self) -> str:
        return "{" + self.key_prefix + "}"

    @property
    def holders_key(self) -> str:
        return f"{self.tag}:holders"

    def user_name(self, index: int) -> str:
        return f"user{index}"

    def user_key(self, user: str) -> str:
        digest = hmac.new(self.identity_secret.encode(), user.encode(), hashlib.sha256)
        if self.lease_global_slots:
            return f"{{{self.key_prefix}:{digest.hexdigest()[:32]}}}:user"
        return f"{self.tag}:user:{digest.hexdigest()[:32]}"

    def own_holders_keys(self) -> dict[str, str]:
        """Under ``lease_global_slots``, each user's pool with the holders key of its own tag
        (its members' holders live there); else none: every pool is in the shared tag."""
        if not self.lease_global_slots:
            return {}
        return {key: key.removesuffix(":user") + ":holders"
                for key in (self.user_key(self.user_name(i)) for i in range(self.users))}

    def tag_reads(self) -> list[tuple[str, list[str]]]:
        """Each hash tag's holders key with the pools the tag holds: the shared tag's (the
        global pool, the resources), then each user's own (``lease_global_slots``)."""
        own = self.own_holders_keys()
        shared = [key for key in self.pools() if key not in own]
        return [(self.holders_key, shared)] + [(holders, [pool]) for pool, holders in own.items()]

    @property
    def global_key(self) -> str:
        return f"{self.tag}:global"

    def resource_key(self, name: str) -> str:
        return f"{self.tag}:resource:{name}"

    def pools(self) -> dict[str, int]:
        """Every pool a stream may take, by key, with its capacity."""
        pools = {self.user_key(self.user_name(i)): self.max_per_user for i in range(self.users)}
        pools[self.global_key] = self.max_global
        pools.update({self.resource_key(name): cap for name, cap in self.resources.items()})
        return pools

    def pools_of(self, user: str | None, resources: list[str]) -> list[str]:
        """The pools one stream takes: its user's and the global pool (with a user), and its
        resources'."""
        keys = [self.user_key(user), self.global_key] if user is not None else []
        return keys + [self.resource_key(name) for name in resources]

    def pool_name(self, key: str) -> str:
        if key == self.global_key:
            return "global"
        for name in self.resources:
            if key == self.resource_key(name):
                return f"resource:{name}"
        for i in range(self.users):
            if key == self.user_key(self.user_name(i)):
                return f"per_user:{self.user_name(i)}"
        return key

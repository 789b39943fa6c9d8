"""Every Redis key the platform uses, built in one place.

Keys that belong to one chat carry the chat id as a Redis Cluster hash tag
(``{...}``) so a chat's queue and its task records share one slot. Lane queue
names are the bare Celery queue names, because kombu's Redis transport reads
them as they are (``lane`` for kombu priority 0, ``lane:N`` for 1..9).
"""

from __future__ import annotations

import re

PREFIX = "dispatch:"
PRIORITY_LEVELS = 10

CONFIG_VERSION = PREFIX + "config:version"
LEASES = PREFIX + "leases"
METRICS_TOTAL = PREFIX + "m:total"
REJECTIONS_RECENT = PREFIX + "m:rejections"
LANE_CONTROL_LOG = PREFIX + "lane-log"
CHAT_AUDIT_CURSOR = PREFIX + "chat-audit-cursor"
#: Where the audit's walk of parked leases (``+inf``: queued records the sweep left waiting) goes on from.
PARKED_AUDIT_CURSOR = PREFIX + "parked-audit-cursor"
#: Where audit.lua's walk of the waiting tasks (the deadlines set) goes on from (an offset).
WAITING_AUDIT_CURSOR = PREFIX + "waiting-audit-cursor"
#: Prefix of every per-chat key (chat queues and chat-scoped task records).
CHAT_PREFIX = PREFIX + "chat:"


def chat_tag(chat_id: str) -> str:
    # A '}' inside the id would end the tag early; every key of the chat still
    # gets the same tag, which is all Cluster needs.
    return "{" + chat_id + "}"


#: After a chat's tagged part (``CHAT_PREFIX`` + ``chat_tag``): its queue, and its records' prefix.
CHAT_QUEUE_SUFFIX = ":q"
CHAT_RECORDS_SUFFIX = ":t:"


def chat_queue(chat_id: str) -> str:
    return CHAT_PREFIX + chat_tag(chat_id) + CHAT_QUEUE_SUFFIX


def chat_record_prefix(chat_id: str) -> str:
    return CHAT_PREFIX + chat_tag(chat_id) + CHAT_RECORDS_SUFFIX


def task_record(task_id: str, chat_id: str | None = None) -> str:
    if chat_id:
        return chat_record_prefix(chat_id) + task_id
    return f"{PREFIX}t:{task_id}"


TOMBSTONE_PREFIX = PREFIX + "done:"


def tombstone(task_id: str) -> str:
    """A finished task's outcome, kept briefly so a late redelivery can re-store it."""
    return f"{TOMBSTONE_PREFIX}{task_id}"


def task_history(task_id: str) -> str:
    """A task's own events (text, one JSON event a line; a list before: tasks.history), kept as long as its
    result row; by id alone. The events its worker held when it stored a final row ride in that row instead."""
    return f"{PREFIX}hist:{task_id}"


def task_progress(task_id: str) -> str:
    """A running task's last reported progress (``ctx.progress``, tasks.history)."""
    return f"{PREFIX}prog:{task_id}"


def lane_queue(lane: str, kombu_priority: int) -> str:
    """The Redis list kombu reads for ``lane`` at its own priority (0 first)."""
    return lane if kombu_priority == 0 else f"{lane}:{kombu_priority}"


def lane_queues(lane: str) -> list[str]:
    return [lane_queue(lane, p) for p in range(PRIORITY_LEVELS)]


#: What a lane's name may be (``lanes.models`` validates it with the same pattern): no ':', so
#: ``lane_doorbell`` and a lane's lists can never be another lane's.
LANE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: Celery queues that are never lanes (their names are refused as lane names by ``lanes.models``).
NON_LANE_QUEUES = frozenset({"ingress", "celery"})
#: Name prefixes and suffixes of kombu's and Celery's own queues (remote-control replies
#: ``<id>.reply.celery.pidbox``, events), refused as lane names by ``lanes.models`` too.
NON_LANE_PREFIXES = ("_kombu.", "celeryev.", "celery-task-meta-", "celery-taskset-meta-", "chord-unlock")
NON_LANE_SUFFIXES = (".pidbox",)
#: Suffix of a lane's doorbell, beside its lists (the Lua scripts append it to the lane's name).
DOORBELL_SUFFIX = ":bell"


def is_lane_queue(queue: str) -> bool:
    """Whether the Celery queue ``queue`` is a lane's (its messages are the platform's, pushed with a ring)."""
    return (queue not in NON_LANE_QUEUES and LANE_NAME_RE.match(queue) is not None
            and not queue.startswith(NON_LANE_PREFIXES) and not queue.endswith(NON_LANE_SUFFIXES))


def lane_doorbell(lane: str) -> str:
    """A list holding at most one token, pushed whenever a message is pushed onto ``lane``'s lists.

    Workers block on it instead of on the lists and then take messages in one script
    that names them in their in-hand set (``lanes/lua/pop_more.lua``, docs/liveness.md).
    The token is the bits of the lists pushed since it was rung (bit p: kombu priority p).
    Bare like the lists (``lane:bell``), because the scripts build it from a list's name.
    """
    return lane + DOORBELL_SUFFIX


DELAYED_PREFIX = PREFIX + "delayed:"
CHAT_WAITING_PREFIX = PREFIX + "chatwait:"


def lane_delayed(lane: str) -> str:
    return f"{DELAYED_PREFIX}{lane}"


def lane_chat_waiting(lane: str) -> str:
    """Count of this lane's chat messages waiting behind their chat's head."""
    return f"{CHAT_WAITING_PREFIX}{lane}"


def idempotency(task_type: str, key: str) -> str:
    """The record of an idempotency key of ``task_type``.

    The type's length comes first: type names may contain ``:``, and without it
    type ``sms`` with key ``send:order-1`` and type ``sms:send`` with key
    ``order-1`` shared one key (the second dispatch came back as a duplicate of
    the first). ``idemp:`` rather than ``idem:`` keeps these apart from every
    key of the old format (see ``legacy_idempotency``).
    """
    return f"{PREFIX}idemp:{len(task_type)}:{task_type}:{key}"


def legacy_idempotency(task_type: str, key: str) -> str:
    """The ambiguous key used before ``idempotency`` (kept only to honour keys stored then).

    Admission still looks it up (never writes it) when the new key is absent, so
    a retry of a call made just before an upgrade is still a duplicate; such keys
    expire after their type's idempotency window, after which the lookup finds
    nothing and can be removed. Lookup rather than a one-off rename: renaming
    would have to re-parse the ambiguous names it exists to replace.
    """
    return f"{PREFIX}idem:{task_type}:{key}"


#: A dedupe key's hash (throttle / debounce: the task that holds the key), beside its idempotency key.
DEDUPE_SUFFIX = ":dd"


def dedupe(task_type: str, key: str) -> str:
    """The task a throttled or debounced type's key names (admit.lua): its id, record and until when."""
    return idempotency(task_type, key) + DEDUPE_SUFFIX


def metrics_minute(minute: int) -> str:
    return f"{PREFIX}m:min:{minute}"


def chat_index() -> str:
    """Sorted set of chats with a backlog, scored by backlog length (dashboard)."""
    return PREFIX + "chats"


# --- operator's view (metrics read on demand, lane controls) -------------------

#: Set of lanes whose consumption is paused (workers skip them, also at start).
PAUSED_LANES = PREFIX + "lanes:paused"
#: Set of lanes being drained (closed, waiting to empty); shown on the dashboard.
DRAINING_LANES = PREFIX + "lanes:draining"
#: Short lock so that one process at a time records a depth/throughput sample.
SAMPLE_LOCK = PREFIX + "m:sample-lock"
#: Sorted set of (time, each limit's all-time admitted count) samples: the current rate of a limit.
LIMIT_SAMPLES = PREFIX + "m:limit-samples"


def paused_workers(lane: str) -> str:
    """Workers that stopped consuming ``lane`` on pause, so resume restarts exactly them."""
    return f"{PREFIX}lanes:paused:{lane}:workers"


def metrics_samples(lane: str) -> str:
    """Sorted set of (time, waiting, completed-total) samples of a lane, for the dashboard charts."""
    return f"{PREFIX}m:samples:{lane}"


# --- deadlines of waiting tasks (tasks.maintenance, expire.lua) -----------------

#: Sorted set of waiting task records scored by their deadline (epoch ms): written
#: at admission and on retry, removed when a worker claims or finishes the task.
DEADLINES = PREFIX + "deadlines"
#: Sorted set of records expired while waiting whose dead-letter and result rows
#: are not yet confirmed written, scored by when to hand them out again (epoch ms).
EXPIRED_PENDING = PREFIX + "expired-pending"
#: Hash of the maintenance loop's own counters (runs, last run, promoted, swept, expired).
MAINTENANCE_STATS = PREFIX + "m:maintenance"


# --- worker heartbeats (which lanes have a live consumer) ----------------------

#: Sorted set of live workers: hostname -> heartbeat expiry (ms since the epoch).
WORKERS = PREFIX + "workers"


def worker_heartbeat(hostname: str) -> str:
    """A worker's last heartbeat (JSON: queues, pid, host, started), expiring unless renewed."""
    return f"{PREFIX}worker:{hostname}"


def lane_consumers(lane: str) -> str:
    """Sorted set of the workers holding ``lane``: hostname -> heartbeat expiry (ms since the epoch).

    Read by admission (one ZCOUNT in admit.lua) and by every operator view.
    """
    return f"{PREFIX}lanes:consumers:{lane}"


# --- limits (flow control; lanes/lua/_lib.lua's gate) ----------------------------
#
# Layout (read by the visible side too: dashboard, ``manage.py lanes``, metrics):
# - ``LIMIT_DEFS`` hash: limit name -> JSON {"scope", "rate", "burst",
#   "max_in_flight", "fair_share", "weights", "window"}, written by every
#   process's config cache on (re)load (tasks.config), read by the scripts.
# - An *instance* of a limit is ``limit_base(name, value)`` (value: '' for a
#   global limit, the chat id for a chat limit, the limit_key for a key limit),
#   with the suffixes the scripts append:
#     ``:b`` bucket hash {t: tokens, ts: ms}, expiring once it would be full;
#     ``:f`` set of the *task record keys* holding a slot (published, not finished;
#           record keys rather than task ids, so the audit finds each record);
#     ``:w`` waiting zset: record key -> (kombu priority) * 1e13 + seq (``LIMIT_SEQ``):
#           higher priority first, first come first served within one;
#     ``:p`` paused-until ms (string with PX expiry), set by a Retry-After.
# - ``LIMIT_DUE`` zset: instance base -> ms when its head may next be admitted.
# - ``limit_instances(name)`` zset: base -> waiting + holding count; an idle instance leaves it.
# - ``limit_ring(name)`` list: keys of a fair-share limit with a backlog, in turn
#   order; ``limit_credit(name)`` hash: key -> tasks admitted in its current turn;
#   ``limit_base(name, '')`` of a fair-share limit: its limit-wide ``:f`` set (the window).
# - ``lane_limited(lane)`` counter of the lane's tasks waiting on a limit (in the lane's depth).
# - Metrics (``METRICS_TOTAL`` / ``metrics_minute``): ``lim_admitted|{name}``, ``lim_throttled|{name}``.
# A task record subject to limits has ``lim`` (its instance bases, newline-separated,
# in the type's order), ``kp`` (its kombu priority) and, while waiting, ``st`` =
# ``limited`` and ``lw`` = the base it waits on; it is then in no lease and no broker list.

LIMIT_PREFIX = PREFIX + "lim:"
LIMIT_DEFS = LIMIT_PREFIX + "def"
LIMIT_DUE = LIMIT_PREFIX + "due"
LIMIT_SEQ = LIMIT_PREFIX + "seq"
LIMIT_AUDIT_CURSOR = LIMIT_PREFIX + "audit-cursor"
#: The scripts build ``LANE_PREFIX + lane + LANE_LIMITED_SUFFIX`` (``lane_limited``).
LANE_PREFIX = PREFIX + "lane:"
LANE_LIMITED_SUFFIX = ":limited"


def limit_base(name: str, value: str = "") -> str:
    """One instance of limit ``name`` (names have no ':', so the value may)."""
    return f"{LIMIT_PREFIX}{name}:{value}"


#: Suffixes of a limit instance's keys (the layout above).
LIMIT_BUCKET_SUFFIX = ":b"
LIMIT_HOLDING_SUFFIX = ":f"
LIMIT_WAITING_SUFFIX = ":w"
LIMIT_PAUSED_SUFFIX = ":p"


def limit_bucket(base: str) -> str:
    return base + LIMIT_BUCKET_SUFFIX


def limit_holding(base: str) -> str:
    return base + LIMIT_HOLDING_SUFFIX


def limit_waiting(base: str) -> str:
    return base + LIMIT_WAITING_SUFFIX


def limit_paused(base: str) -> str:
    return base + LIMIT_PAUSED_SUFFIX


#: After ``LIMIT_PREFIX``, before a limit's name: its instances index, fair-share ring and credits.
LIMIT_INSTANCES_INFIX = "inst:"
LIMIT_RING_INFIX = "ring:"
LIMIT_CREDIT_INFIX = "credit:"


def limit_instances(name: str) -> str:
    return LIMIT_PREFIX + LIMIT_INSTANCES_INFIX + name


def limit_ring(name: str) -> str:
    return LIMIT_PREFIX + LIMIT_RING_INFIX + name


def limit_credit(name: str) -> str:
    return LIMIT_PREFIX + LIMIT_CREDIT_INFIX + name


def lane_limited(lane: str) -> str:
    return LANE_PREFIX + lane + LANE_LIMITED_SUFFIX


#: Suffix of a lane's count of tasks not claimed yet (admission's depth; the scripts build it
#: from ``LANE_PREFIX`` and the record's lane, and keep it in step with ``DEADLINES``: _lib.lua).
LANE_WAITING_SUFFIX = ":waiting"


def lane_waiting(lane: str) -> str:
    return LANE_PREFIX + lane + LANE_WAITING_SUFFIX


#: Suffix of a lane's hash of API tokens' tasks not claimed yet: field = token id, value = its tasks
#: among the lane's waiting count (_lib.lua ``caller_of``; admission's ``caller_quota``). Written
#: beside the lane's count by the same two functions; ``LANE_CALLERS_COUNTED`` is the field
#: callers_audit.lua's recount leaves in it, so a hash without it is one that was lost.
LANE_CALLERS_SUFFIX = ":callers"
LANE_CALLERS_COUNTED = "counted"


def lane_callers(lane: str) -> str:
    return LANE_PREFIX + lane + LANE_CALLERS_SUFFIX


# --- process liveness (lanes.leases, reclaim.lua) -------------------------------

#: Sorted set of worker processes (main processes and pool children, ``host:pid``)
#: -> liveness expiry (ms since the epoch), written by each process's lease thread.
PROCS = PREFIX + "procs"
#: Sorted set of processes whose own beat is late but whose pid still exists on
#: their host (a stopped or starved process), vouched for by a live process of the
#: same host: ``host:pid`` -> until (ms). Their claims are left to their leases.
PROCS_VOUCHED = PREFIX + "procs:vouched"
#: Prefix of every process's held set (``process_held``).
HELD_PREFIX = PREFIX + "held:"
#: Prefix of every process's in-hand set (``process_in_hand``).
IN_HAND_PREFIX = PREFIX + "inhand:"


def process_held(process: str) -> str:
    """Set of task records a process claimed (running, or finished and not yet settled)."""
    return HELD_PREFIX + process


def process_in_hand(process: str) -> str:
    """Set of task records whose message a worker's main process popped and has not acked."""
    return IN_HAND_PREFIX + process



#: The constants the Lua scripts read by the same names (``lanes.lua.loader`` writes them as
#: ``local`` lines ahead of every script): a key the scripts build from a prefix or another key
#: gets its suffix from here, never from a literal of its own.
LUA_CONSTANTS = ("DOORBELL_SUFFIX", "LANE_WAITING_SUFFIX", "LANE_LIMITED_SUFFIX", "LIMIT_BUCKET_SUFFIX",
                 "LIMIT_HOLDING_SUFFIX", "LIMIT_WAITING_SUFFIX", "LIMIT_PAUSED_SUFFIX", "CHAT_QUEUE_SUFFIX",
                 "CHAT_RECORDS_SUFFIX", "LIMIT_INSTANCES_INFIX", "LIMIT_RING_INFIX", "LIMIT_CREDIT_INFIX",
                 "DEDUPE_SUFFIX", "TOMBSTONE_PREFIX", "DELAYED_PREFIX", "CHAT_WAITING_PREFIX", "CHAT_PREFIX",
                 "LANE_CALLERS_SUFFIX", "LANE_CALLERS_COUNTED")

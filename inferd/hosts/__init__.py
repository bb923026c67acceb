"""Model hosts: a model instance in a process of its own, as Triton runs Python models in stubs.

The core decides, hosts execute: the core keeps the queues, batching decisions, sequences,
ensembles, priorities and statistics, and hands a formed batch to the instance's host through
shared memory (:mod:`inferd.hosts.protocol`); the host runs the backend's own instance
(:mod:`inferd.hosts.runtime`, started by ``python -m inferd.serve.host_process``). The core's side
is :class:`~inferd.hosts.instance.HostedInstance` (one per hosted instance: batches, responses,
calls back into the server, restarts) and :class:`~inferd.hosts.registry.Hosts` (which models are
hosted; the live hosts). A host can be killed at any time without hurting the core: a stuck or
crashing model, an unload and a shutdown all end in bounded time.
"""

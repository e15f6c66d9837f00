"""Where Ray's tasks can run: waiting for a node that can run them, and counting their slots
(for ``shmloader.ray``'s datasets and its prepare). Ray is imported inside the functions only:
nothing here may run at ``import shmloader``.
"""

from __future__ import annotations

import time
import warnings

from .._errors import LoaderError

__all__ = ["task_slots", "wait_for_a_node"]


def wait_for_a_node(need: dict[str, float], timeout: float, what: str) -> None:
    """Return once a live node has ``need`` (resource -> amount one of the tasks ``what`` names
    takes); LoaderError at once where none has and no autoscaler could add one, else after
    ``timeout`` seconds. Its warning points at the line that called the public function
    (a dataset, a prepare) that called this."""
    import ray

    need = {k: float(v) for k, v in need.items() if v > 0}

    def nodes() -> list[dict[str, float]]:
        return [n["Resources"] for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]

    def fits(have: dict[str, float]) -> bool:
        return all(have.get(k, 0.0) >= v for k, v in need.items())

    if any(fits(n) for n in nodes()):
        return
    asked = ", ".join(f"{k}={v:g}" for k, v in need.items())
    def described() -> str:
        return "; ".join(", ".join(f"{k}={n.get(k, 0.0):g}" for k in need) for n in nodes()) or "no live node"
    if not _autoscaler_could_add(need):
        raise LoaderError(f"the {what} need {asked} on one node, and no node of this cluster has it "
                          f"(its nodes: {described()}) and no autoscaler can add one: start a node "
                          "with it (ray start --resources=...), or pass num_cpus= and resources= that a "
                          "node has")
    from ray.autoscaler.sdk import request_resources

    warnings.warn(f"shmloader.ray: no node has {asked} for the {what} yet (its nodes: {described()}); "
                  f"asking the autoscaler for one and waiting up to {timeout:g} s", RuntimeWarning, stacklevel=3)
    request_resources(bundles=[need])
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(fits(n) for n in nodes()):
                return  # from here the tasks ask for what they need
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    finally:
        request_resources(bundles=[])  # answered or given up: the request is withdrawn
    raise LoaderError(f"no node with {asked} for the {what} came up within {timeout:g} s (its nodes: "
                      f"{described()}): the autoscaler could not add one")


def _autoscaler_could_add(need: dict[str, float]) -> bool:
    """Whether the cluster's autoscaler has a node type with ``need`` that it may still start.
    Ray publishes its autoscaler's node types in the GCS (what Ray Data's own autoscaling reads);
    a cluster started without an autoscaler has none. Unknown (another Ray): True, so that the
    wait is bounded by the timeout rather than refused."""
    try:
        import ray._private.state

        config = ray._private.state.state.get_cluster_config()
    except Exception:
        return True
    if not config or not config.node_group_configs:
        return False
    return any(g.max_count != 0 and all(g.resources.get(k, 0) >= v for k, v in need.items())
               for g in config.node_group_configs)


def task_slots(num_cpus: float, resources: dict[str, float] | None) -> int:
    """How many tasks that each take ``num_cpus`` and ``resources`` the cluster can run at once
    now (its CPUs and each custom resource asked for, over what one task takes); 0 where it has
    none of one of them (a node that left since ``wait_for_a_node``)."""
    import ray

    total = ray.cluster_resources()  # type: ignore[no-untyped-call]
    need = {"CPU": num_cpus, **(resources or {})}
    fits = [total.get(k, 0.0) / v for k, v in need.items() if v > 0]
    slots = int(min(fits) if fits else total.get("CPU", 1.0))
    return max(0, slots)

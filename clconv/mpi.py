"""Data-parallel training across processes and hosts through MPI (mpi4py on MPICH: the
``mpi`` extra; launch with ``mpiexec -n 2 python ...``).

Every process (rank) holds the same modules (same seeds, or weights broadcast with
:meth:`DataParallel.broadcast`) and trains on its own share of each batch. After the
backward pass, :class:`DataParallel` sums every module's ``grad_weight`` and ``grad_bias``
over the ranks (``MPI.Allreduce``), each rank's weighted by its local batch, so that every
rank ends with the gradient of the loss averaged over all the ranks' images:

    grad = sum over ranks r of (n_r * grad_r) / sum over ranks of n_r

(``grad_r`` the mean over rank r's n_r images; ranks may hold different numbers of images,
none too). MPI wheels are not GPU-aware: gradients travel through host arrays, in float64
(MPICH and Open MPI give every rank the same sum: tests/mpi_check.py checks the bits). A
reduction that fails on one rank aborts the communicator: its collectives would no longer
pair with the other ranks'. A layer's
reduction starts as soon as its backward is enqueued (:meth:`DataParallel.ready`): a helper
thread waits for its gradients' copy to the host and runs its Allreduce while the device
computes the earlier layers' backward; :meth:`DataParallel.finish` waits for the last one and
copies the sums back. That pays only where a layer's reduction takes long against the
backward of what follows: by default (``overlap="auto"``) layers of at least
OVERLAP_MIN_BYTES of gradients are reduced on the thread, smaller ones in ``finish``
(``mpiexec -n 2 python -m bench mpi`` on two PoCL ranks: small layers ran about as fast overlapped
as not, their reductions a small share of a step).
"""
import queue as queues
import sys
import threading
import time

import numpy as np
import pyopencl as cl

from .recording import not_capturable

OVERLAP_MIN_BYTES = 1 << 20   # "auto": a layer's float64 gradients from this size on go to the helper thread


def _grads(module):
    return [g for g in (module.grad_weight, module.grad_bias) if g is not None]


class DataParallel:
    """Sums the gradients of ``modules`` (:class:`clconv.nn.Conv2d` and the like) over the
    ranks of ``comm`` (default ``MPI.COMM_WORLD``).

    One step::

        dp.start(local_batch)             # this rank's images in the step (0 allowed)
        for layer in reversed(layers):    # the usual backward, gradients set (zero_grad first)
            g = layer.backward(x, g)
            dp.ready(layer)               # its reduction starts, overlapping what follows
        dp.finish()                       # every module's gradients now summed over the ranks

    ``overlap``: "auto" (layers of at least OVERLAP_MIN_BYTES of gradients on the helper
    thread), True (every layer) or False (every reduction in :meth:`finish`, on the calling
    thread).
    """

    def __init__(self, modules, comm=None, overlap="auto"):
        from mpi4py import MPI   # the `mpi` extra
        self.MPI = MPI
        self.comm = comm or MPI.COMM_WORLD
        # asked once: under THREAD_SERIALIZED the main thread may not call MPI while the helper does
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.modules = list(modules)
        # a helper thread calls MPI while the main thread waits for nothing MPI: SERIALIZED suffices
        threads = MPI.Query_thread() >= MPI.THREAD_SERIALIZED
        if overlap not in ("auto", True, False):
            raise ValueError(f"overlap must be 'auto', True or False, got {overlap!r}")
        # per module: one float64 host buffer for all its gradients, float32 ones to copy through,
        # and whether the helper thread reduces it
        self._host = {}
        for m in self.modules:
            flat = np.empty(sum(g.size for g in _grads(m)))
            threaded = threads and (overlap is True or overlap == "auto" and flat.nbytes >= OVERLAP_MIN_BYTES)
            self._host[id(m)] = (flat, [np.empty(g.shape, g.dtype) for g in _grads(m)], threaded)
        self.overlap = any(entry[2] for entry in self._host.values())
        self._weight = self._total = None
        self._jobs, self._waiting = queues.Queue(), []
        self._thread = None

    def broadcast(self, root=0):
        """Every module's parameters from rank ``root`` to all ranks (blocking; not within a step)."""
        for m in self.modules:
            for p in m.parameters():
                host = p.get()
                self.comm.Bcast(host, root=root)
                p.set(host)

    def start(self, local_batch):
        """Begin a step in which this rank's gradients are means over ``local_batch`` images
        (None: they are sums, to be added as they are)."""
        if self._weight is not None:
            raise RuntimeError("DataParallel.start() called twice without finish()")
        # the batches' sum is asked for either way, so that every rank makes the same MPI calls
        total = self.comm.allreduce(0.0 if local_batch is None else float(local_batch), op=self.MPI.SUM)
        if local_batch is None:
            self._weight, self._total = 1.0, 1.0
        else:
            if total <= 0:
                raise ValueError(f"no rank holds an image in this step (local batches sum to {total})")
            self._weight, self._total = float(local_batch), total
        self._waiting = []
        if self.overlap and self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="clconv-mpi", daemon=True)
            self._thread.start()

    def ready(self, module):
        """``module``'s backward is enqueued: copy its gradients to the host (without waiting)
        and reduce them once the copy is done."""
        if self._weight is None:
            raise RuntimeError("DataParallel.ready() before start()")
        if any(job[0] is module for job in self._waiting):
            raise RuntimeError(f"DataParallel.ready() twice in one step for {module!r}")
        _, parts, threaded = self._host[id(module)]
        not_capturable(what="MPI reductions")   # copies to the host and back, and collectives
        events = [cl.enqueue_copy(module.queue, h, g.base_data, src_offset=g.offset, is_blocking=False)
                  for h, g in zip(parts, _grads(module))]
        job = (module, events, threading.Event())
        self._waiting.append(job)
        if threaded:
            self._jobs.put(job)

    def finish(self):
        """Wait for every reduction of the step and copy the sums back into the modules'
        gradients (enqueued on their queues, before anything enqueued later)."""
        if self._weight is None:
            raise RuntimeError("DataParallel.finish() before start()")
        jobs, self._waiting = self._waiting, []
        try:
            for job in jobs:   # the thread's first (so that one thread calls MPI at a time), in order
                if self._host[id(job[0])][2]:
                    job[2].wait()
            named = {id(job[0]) for job in jobs}
            missing = [m for m in self.modules if id(m) not in named]
            if missing:   # the other ranks are waiting in collectives this one will never make
                self._abort(RuntimeError(f"DataParallel.finish(): ready() was not called for {missing}; every rank "
                                         "must reduce every module, in the same order"))
            for job in jobs:
                if not self._host[id(job[0])][2]:
                    self._reduce(job)
        finally:
            self._weight = self._total = None
        if jobs:
            not_capturable(what="MPI reductions")   # the sums copied back
        for module, _, _ in jobs:
            parts = self._host[id(module)][1]
            for h, g in zip(parts, _grads(module)):
                cl.enqueue_copy(module.queue, g.base_data, h, dst_offset=g.offset, is_blocking=False)

    def _serve(self):
        while True:
            job = self._jobs.get()
            try:
                self._reduce(job)
            finally:
                job[2].set()

    def _abort(self, exc):
        """Say why on stderr, then abort the communicator (every rank stops)."""
        print(f"clconv.mpi: rank {self.rank} of {self.size}: {exc!r}; aborting", file=sys.stderr, flush=True)
        time.sleep(0.5)   # time for the launcher to forward the message before it kills the ranks
        self.comm.Abort(1)

    def _reduce(self, job):
        try:
            self._reduce_one(job)
        except Exception as exc:   # noqa: BLE001 -- a rank that skips a collective would hang or mix the others
            self._abort(exc)

    def _reduce_one(self, job):
        module, events, done = job
        cl.wait_for_events(events)
        flat, parts, _ = self._host[id(module)]
        at = 0
        for h in parts:
            flat[at:at + h.size] = h.ravel()
            at += h.size
        flat *= self._weight
        self._allreduce(flat)
        flat /= self._total
        at = 0
        for h in parts:
            h.ravel()[:] = flat[at:at + h.size]
            at += h.size

    def _allreduce(self, buffer):
        self.comm.Allreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)

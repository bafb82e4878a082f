"""One convolution spread over several devices of one context: a queue per device, each
running a part of every pass with a plan of its own (:class:`SpreadPlan`).

Two splits, per pass:
  images   data parallel: each device takes a run of images (for grad-weight, every device
           sums its images' gradient into a slot of one workspace, and the home queue adds
           the slots in device order: the same bits on every run)
  groups   model parallel, as AlexNet's two GPUs: each device takes a run of groups (their
           filters, input channels and output channels)
A part is sized by the devices' shares (their measured throughput, from the tuning cache, else
their compute units). Which split a pass takes is measured (``clconv.tuner.tune_spread``,
stored in the tuning cache) or, unmeasured, a rule; ``explain()`` says which and why.

Data movement. A part reads its slice of an operand in place where the slice is one run of
memory (an image split, or a group split of one image or of the weights), moved to its device
first (``enqueue_migrate_mem_objects``) where the slice starts on the device's base-address
alignment; a slice strided across images (a group split of a batch) is gathered on the
part's own queue by one rectangular copy. A part writes its slice of a result through a
sub-buffer when the slice is one aligned run; otherwise it writes a buffer of its own, which
the home queue copies in after every part is done. So no two devices ever write one buffer,
except through disjoint aligned sub-buffers. The home queue (the call's, else the first) waits
for its earlier work before any part starts, and every part is done before it goes on.
"""
import dataclasses
from collections import namedtuple

import numpy as np
import pyopencl as cl

from . import memory, storage
from .algorithms.partials import sum_partials
from .buffers import Ref, idx_for, ref
from .geometry import PASSES
from .programs import ClconvError
from .recording import not_capturable
from .validate import check_grad_output_array, finish, prepare, queue_context

SPLITS = ("images", "groups")

Part = namedtuple("Part", "queue plan first count")   # first image (or group) and how many
Part.__doc__ = "One device's share of a pass: its queue, its plan, its first image (or group) and how many."

# A slab: ``count`` runs of ``inner`` elements, ``pitch`` apart, from element ``start`` of an array
Slab = namedtuple("Slab", "start inner count pitch")


def device_label(queue):
    d = queue.device
    return f"{d.name.strip()} ({d.max_compute_units} compute units)"


def counts(total, shares):
    """``total`` items cut in proportion to ``shares`` (largest remainders; the same on every run)."""
    shares = np.asarray(shares, float)
    exact = total * shares / shares.sum()
    cut = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - cut), kind="stable")[:total - cut.sum()]:
        cut[i] += 1
    return [int(c) for c in cut]


def default_split(g, devices):
    """The split by rule, with why: images while every device gets one, else groups."""
    if g.N >= devices:
        return "images", f"by rule (not measured): {g.N} images for {devices} devices"
    if g.groups >= devices:
        return "groups", f"by rule (not measured): {g.N} image(s) but {g.groups} groups for {devices} devices"
    return "images", f"by rule (not measured): {g.N} image(s) and {g.groups} group(s); some devices idle"


class SpreadPlan:
    """Grouped conv2d of fixed shapes spread over ``queues`` (in-order, on devices of one
    context); the same passes and arguments as :class:`clconv.plan.Plan`.

    ``split``: "auto" (measured per pass in the tuning cache, else by rule), "images" or
    "groups"; ``shares``: the devices' relative speeds (default: measured, else compute units);
    ``make_plan(geometry, queue)``: a part's plan on its queue. ``tuned``: {pass: entry} from
    the tuning cache (:func:`clconv.tuner.tune_spread`). ``allocator`` (the plan's, or a
    call's) serves the results and the home queue's buffers; each part's workspace comes from
    its own queue's pool."""

    def __init__(self, geometry, dtype, queues, make_plan, *, split="auto", shares=None, tuned=None, allocator=None):
        queues = tuple(queues)
        if len(queues) < 2:
            raise ValueError(f"a spread plan needs at least two queues, got {len(queues)}")
        for q in queues:
            if not isinstance(q, cl.CommandQueue):
                raise TypeError(f"queues must be pyopencl.CommandQueue s, got {type(q).__name__}")
        self.context = queue_context(queues[0])
        if any(queue_context(q) != self.context for q in queues[1:]):
            raise ValueError("the queues of a spread plan must share one OpenCL context (make one context over the "
                             "devices: clconv.device_queues)")
        if split not in ("auto", *SPLITS):
            raise ValueError(f"split must be 'auto' or one of {SPLITS}, got {split!r}")
        if shares is not None and (len(shares) != len(queues) or min(shares) < 0 or not sum(shares) > 0):
            raise ValueError(f"shares must be {len(queues)} non-negative numbers, not all zero; got {shares!r}")
        self.geometry, self.dtype, self.queues, self.allocator = geometry, np.dtype(dtype), queues, allocator
        self.queue = queues[0]
        # sub-buffer origins: multiples of every device's base-address alignment, in bytes (the
        # context of sub-devices may list only their parent: both are asked)
        self._align = max(d.mem_base_addr_align for d in (*self.context.devices, *(q.device for q in queues))) // 8
        # (bytes: the driver reports bits)
        self._make_plan, self._parts = make_plan, {}
        self._choice = {}   # pass -> (split, shares, why)
        tuned = tuned or {}
        for p in PASSES:
            entry = tuned.get(p) if split == "auto" and shares is None else None
            if entry and (entry.get("split") in SPLITS and len(entry.get("shares", ())) == len(queues)
                          and (entry["split"] == "images" or geometry.groups > 1)):
                timings = ", ".join(f"{k} {v} ms" for k, v in sorted(entry.get("timings", {}).items()))
                self._choice[p] = (entry["split"], tuple(entry["shares"]), f"fastest in the tuning cache ({timings})")
                continue
            chosen, why = default_split(geometry, len(queues)) if split == "auto" else (split, "as asked")
            if chosen == "groups" and geometry.groups == 1:
                raise ValueError(f"split='groups' needs groups > 1, got input {list(geometry.input_shape)} with "
                                 f"weight {list(geometry.weight_shape)} of 1 group")
            given = shares is not None
            self._choice[p] = (chosen, tuple(shares) if given else tuple(q.device.max_compute_units for q in queues),
                               why + ("; shares as given" if given else "; shares by compute units"))
        for p in PASSES:
            self._parts_for(*self._choice[p][:2])   # every part's plan made now: errors before any call
        self._shapes = geometry.pass_shapes()
        g = geometry   # elements per image and per group of each array a pass reads or writes
        self._elements = ({"input": g.C * g.H * g.W, "grad_input": g.C * g.H * g.W, "output": g.K * g.P,
                           "grad_output": g.K * g.P},
                          {"input": g.Cg * g.H * g.W, "grad_input": g.Cg * g.H * g.W, "output": g.Kg * g.P,
                           "grad_output": g.Kg * g.P, "weight": g.Kg * g.Kd, "grad_weight": g.Kg * g.Kd, "bias": g.Kg})

    def _parts_for(self, split, shares):
        key = (split, shares)
        parts = self._parts.get(key)
        if parts is None:
            g, parts, first = self.geometry, [], 0
            for q, n in zip(self.queues, counts(g.N if split == "images" else g.groups, shares)):
                if n:
                    sub = (dataclasses.replace(g, N=n) if split == "images" else
                           dataclasses.replace(g, C=g.Cg * n, K=g.Kg * n, groups=n))
                    parts.append(Part(q, self._make_plan(sub, q), first, n))
                first += n
            self._parts[key] = parts
        return parts

    @property
    def algorithms(self):
        """{pass: the algorithms of its parts, one name or "name0/name1/..."}."""
        out = {}
        for p in PASSES:
            names = [part.plan.algorithms[p] for part in self._parts_for(*self._choice[p][:2])]
            out[p] = names[0] if len(set(names)) == 1 else "/".join(names)
        return out

    @property
    def splits(self):
        """{pass: "images" or "groups"}."""
        return {p: c[0] for p, c in self._choice.items()}

    @property
    def workspace_bytes(self):
        """Largest workspace any part's pass allocates on its device, in bytes."""
        return max((part.plan.workspace_bytes for p in PASSES for part in self._parts_for(*self._choice[p][:2])),
                   default=0)

    def explain(self):
        g = self.geometry
        lines = [f"conv2d input {list(g.input_shape)} weight {list(g.weight_shape)} -> output {list(g.output_shape)}, "
                 f"spread over {len(self.queues)} devices of one context: "
                 + "; ".join(f"{i}: {device_label(q)}" for i, q in enumerate(self.queues))]
        for p in PASSES:
            split, shares, why = self._choice[p]
            what = "image(s)" if split == "images" else "group(s)"
            parts = self._parts_for(split, shares)
            share = ", ".join(f"device {self.queues.index(part.queue)} {part.count} {what} from {part.first}"
                              for part in parts)
            extra = ("; grad-weight summed over the devices in order on the home queue"
                     + (" (each device's sum stored as float16 first)" if self.dtype == np.float16 else "")
                     if split == "images" and p == "backward_weight" else "")
            lines.append(f"{p} split by {split} ({share}; shares {list(shares)}); chosen {why}{extra}")
            for part in parts:
                sub = part.plan.explain().record(p).lines()
                lines += [f"  device {self.queues.index(part.queue)}: {sub[0]}", *("  " + line for line in sub[1:])]
        return "\n".join(lines)

    # -- the passes ---------------------------------------------------------------

    def forward(self, input, weight, bias=None, *, out=None, queue=None, allocator=None, relu=False):
        """As :meth:`clconv.plan.Plan.forward`, each part on its device."""
        return self._call("forward", {"input": input, "weight": weight, "bias": bias}, out, queue, allocator, relu)

    def backward_input(self, weight, grad_output, *, out=None, queue=None, allocator=None):
        """As :meth:`clconv.plan.Plan.backward_input`, each part on its device."""
        check_grad_output_array(grad_output, self.geometry)
        return self._call("backward_input", {"weight": weight, "grad_output": grad_output}, out, queue, allocator)

    def backward_weight(self, input, grad_output, *, out=None, queue=None, allocator=None):
        """As :meth:`clconv.plan.Plan.backward_weight`, each part on its device."""
        check_grad_output_array(grad_output, self.geometry)
        return self._call("backward_weight", {"input": input, "grad_output": grad_output}, out, queue, allocator)

    def _call(self, pass_name, arrays, out, queue, allocator, relu=False):
        """Check and marshal a pass's arguments (``arrays``: {name: array}, in argument order), run
        it over the parts, and return its result as the caller expects."""
        shapes, out_shape = self._shapes[pass_name]
        allocator = allocator or self.allocator
        queue, dev, numpy_mode = prepare(queue, self, arrays, shapes, out, out_shape, allocator)
        if self.geometry.N:
            self._run(pass_name, queue, dev, tuple(arrays), allocator, relu)
        elif pass_name == "backward_weight":
            storage.zero(queue, dev["out"])
        return finish(queue, dev, out, numpy_mode)

    def _slab(self, split, name, part):
        """The part's slab of array ``name`` (an argument's name, or the result's: "output",
        "grad_input", "grad_weight"); None for the whole array."""
        g, (image, per_group) = self.geometry, self._elements
        if split == "images":
            if name in image:
                return Slab(part.first * image[name], part.count * image[name], 1, 0)
            return None   # weight, bias, grad_weight: whole
        if name in image and g.N > 1:
            return Slab(part.first * per_group[name], part.count * per_group[name], g.N, image[name])
        return Slab(part.first * per_group[name], part.count * per_group[name], 1, 0)

    def _run(self, pass_name, home, dev, names, allocator, relu=False):
        split, shares, _ = self._choice[pass_name]
        parts = self._parts_for(split, shares)
        result = {"forward": "output", "backward_input": "grad_input", "backward_weight": "grad_weight"}[pass_name]
        isz = self.dtype.itemsize
        out = dev["out"]
        not_capturable(what="a pass spread over several devices")   # markers, barriers, copies between queues
        start = cl.enqueue_marker(home)   # the inputs are ready (uploads, the caller's work on home)
        home.flush()                      # waited on from the other queues: it must reach the device
        # Where each part writes, all taken from the home pool before any part is enqueued: a block
        # a part on the home queue frees during this call must not go to a part on another queue.
        copies, writes = [], []           # (temp, slab) the home queue copies in; each part's result Ref
        reduce = split == "images" and pass_name == "backward_weight"
        if reduce:   # a slot per part, aligned, in one home buffer: the sum runs on home, in order
            n = out.size
            step = -(-n * isz // self._align) * self._align // isz
            # (from the home pool, not the caller's allocator: a whole buffer, so the slots can be sub-buffers)
            slots = memory.allocate(home, step * len(parts) * isz, "grad-weight over devices")
            writes = [Ref(_sub_buffer(slots, i * step * isz, n * isz, self._align), 0, n) for i in range(len(parts))]
            if None in [w.buf for w in writes]:
                raise ClconvError(f"clconv: the driver refused sub-buffers of a {step * len(parts) * isz}-byte buffer")
        else:
            for part in parts:
                slab = self._slab(split, result, part)
                r, temp = self._write(home, out, slab, allocator)
                writes.append(r)
                if temp is not None:
                    copies.append((temp, slab))
        done = []   # each part's last event
        for part, r in zip(parts, writes):
            q = part.queue
            cl.enqueue_barrier(q, wait_for=[start])
            refs, moved, temps = [], [], []
            for name in names:
                a = dev[name]
                if a is None:
                    refs.append(None)
                    continue
                ra, sub, temp = self._read(q, a, self._slab(split, name, part))
                refs.append(ra)
                moved += [sub] if sub is not None else []
                temps += [temp] if temp is not None else []
            if moved:
                cl.enqueue_migrate_mem_objects(q, moved)
            # the part's workspace from its own queue's pool: a caller's allocator, shared by every
            # queue, could hand a block one part frees to another part still running
            part.plan.enqueue(pass_name, q, *refs, r, relu=relu)
            done.append(cl.enqueue_marker(q))
            q.flush()   # waited on from the home queue
            for t in temps:   # gathered inputs: from the part's own queue's pool, read only there
                t.release()
        cl.enqueue_barrier(home, wait_for=done)
        for temp, slab in copies:
            _copy_in(home, temp, out, slab, isz)
            temp.release()
        if reduce:
            idx = idx_for(self.dtype, Ref(slots, 0, step * len(parts)), ref(out))
            sum_partials(home, self.dtype, idx, Ref(slots, 0), len(parts), n, ref(out), False,
                         "grad-weight: sum over devices", stride=step)
            slots.release()

    def _read(self, queue, a, slab):
        """(Ref, sub-buffer to migrate or None, gathered temp or None) of array ``a``'s slab for a part."""
        base = a.offset // a.dtype.itemsize
        isz = a.dtype.itemsize
        if slab is None:
            return ref(a), None, None
        if slab.count == 1:
            sub = _sub_buffer(a.base_data, (base + slab.start) * isz, slab.inner * isz, self._align)
            r = Ref(sub, 0, slab.inner) if sub is not None else Ref(a.base_data, base + slab.start,
                                                                     base + slab.start + slab.inner)
            return r, sub, None
        temp = memory.allocate(queue, slab.inner * slab.count * isz, "gathering a slice for a device")
        cl.enqueue_copy(queue, temp, a.base_data, src_origin=((base + slab.start) * isz, 0, 0), dst_origin=(0, 0, 0),
                        region=(slab.inner * isz, slab.count, 1), src_pitches=(slab.pitch * isz, 0),
                        dst_pitches=(slab.inner * isz, 0))
        return Ref(temp, 0, slab.inner * slab.count), None, temp

    def _write(self, home, out, slab, allocator):
        """(Ref the part writes, temp the home queue copies in or None) for the result's slab."""
        isz = out.dtype.itemsize
        base = out.offset // isz
        if slab.count == 1:
            sub = _sub_buffer(out.base_data, (base + slab.start) * isz, slab.inner * isz, self._align)
            if sub is not None:
                return Ref(sub, 0, slab.inner), None
        temp = memory.allocate(home, slab.inner * slab.count * isz, "a device's part of the result", allocator)
        return Ref(temp, 0, slab.inner * slab.count), temp


def _sub_buffer(buf, origin, size, align):
    """A sub-buffer of ``buf`` at byte ``origin``, or None where the origin is not a multiple of
    ``align`` bytes (or ``buf`` is itself a sub-buffer)."""
    if origin % align:
        return None
    if not isinstance(buf, cl.Buffer):   # a memory pool's block: the same cl_mem as a Buffer
        buf = cl.Buffer.from_int_ptr(buf.int_ptr, retain=True)
    try:
        return buf.get_sub_region(origin, size)
    except cl.Error:
        return None


def _copy_in(queue, temp, out, slab, isz):
    """The home queue's copy of a part's temp into the result's slab."""
    base = out.offset // isz
    if slab.count == 1:
        cl.enqueue_copy(queue, out.base_data, temp, dst_offset=(base + slab.start) * isz, byte_count=slab.inner * isz)
        return
    cl.enqueue_copy(queue, out.base_data, temp, src_origin=(0, 0, 0), dst_origin=((base + slab.start) * isz, 0, 0),
                    region=(slab.inner * isz, slab.count, 1), src_pitches=(slab.inner * isz, 0),
                    dst_pitches=(slab.pitch * isz, 0))

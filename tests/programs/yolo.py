"""Program 7: a YOLO-like single-shot detector with decoding on the host.

Synthetic 32x32 RGB images: one to three rectangles of a pure colour (class 0 red, 1 green, 2 blue)
on noise, at most one object centre per cell of a 4x4 grid. A conv backbone (stride-2 Conv, BatchNorm,
SiLU) to the 4x4 grid, a 1x1 head: per cell an objectness logit, box (sigmoid offsets in the cell,
log size over an anchor) and class logits. Targets are built on the host (which cell is responsible
for which object), the responsible cells gathered by host-computed indices. After training, the
detector runs (in eval mode) on test images and the host decodes: sigmoid, threshold on
objectness x class probability, box decode, per-class NMS; a data-dependent number of boxes per
image, compared with their classes and scores. The library's own NMS operator (tern.op.NonMaxSuppression,
torchvision.ops.nms) is run on all cells' boxes as a cross-check of the host's NMS.
"""
import numpy as np

import harness
from harness import iou, nms

IMG, S, NC = 32, 4, 3
CELL = IMG // S
ANCHOR = 10.0
BATCH, STEPS, LR = 8, 100, 3e-3
THRESH, NMS_IOU = 0.25, 0.45
COLOURS = np.eye(3)


def make_batch(rng, n):
    x = rng.normal(0.0, 0.1, (n, 3, IMG, IMG))
    objs = []
    for b in range(n):
        cells, boxes = set(), []
        for _ in range(int(rng.integers(1, 4))):
            w, h = int(rng.integers(6, 15)), int(rng.integers(6, 15))
            x0, y0 = int(rng.integers(0, IMG - w + 1)), int(rng.integers(0, IMG - h + 1))
            cx, cy = x0 + w / 2, y0 + h / 2
            cell = (int(cy // CELL), int(cx // CELL))
            if cell in cells:
                continue
            cells.add(cell)
            cls = int(rng.integers(0, NC))
            x[b, :, y0:y0 + h, x0:x0 + w] += COLOURS[cls][:, None, None]
            boxes.append((cls, cx, cy, w, h))
        objs.append(boxes)
    return x.astype(np.float32), objs


def targets(objs):
    """Host side: objectness target per cell, the responsible cells (flat index into [N*S*S]), their
    box targets (offset x, y in the cell, log w, h over the anchor) and classes."""
    n = len(objs)
    obj = np.zeros((n, S, S))
    idx, box, cls = [], [], []
    for b, boxes in enumerate(objs):
        for c, cx, cy, w, h in boxes:
            i, j = int(cy // CELL), int(cx // CELL)
            obj[b, i, j] = 1.0
            idx.append((b * S + i) * S + j)
            box.append((cx / CELL - j, cy / CELL - i, np.log(w / ANCHOR), np.log(h / ANCHOR)))
            cls.append(c)
    return obj.reshape(-1), np.array(idx, np.int64), np.array(box), np.array(cls, np.int64)


def decode(pred):
    """Host side on fetched predictions [N, 5+NC, S, S]: per image (boxes x0 y0 x1 y1, classes, scores)
    of the cells above THRESH after per-class NMS, best first."""
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    p = pred.astype(np.float64).transpose(0, 2, 3, 1)  # [N, S, S, 5+NC]
    out = []
    for img in p:
        ii, jj = np.meshgrid(np.arange(S), np.arange(S), indexing='ij')
        cx = (jj + sig(img[..., 1])) * CELL
        cy = (ii + sig(img[..., 2])) * CELL
        w, h = ANCHOR * np.exp(img[..., 3]), ANCHOR * np.exp(img[..., 4])
        logits = img[..., 5:]
        prob = np.exp(logits - logits.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        cls = prob.argmax(-1)
        score = sig(img[..., 0]) * prob.max(-1)
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1).reshape(-1, 4)
        cls, score = cls.reshape(-1), score.reshape(-1)
        cand = np.nonzero(score > THRESH)[0]
        keep = []
        for c in range(NC):
            ci = cand[cls[cand] == c]
            keep += ci[nms(boxes[ci], score[ci], NMS_IOU)].tolist()
        keep = np.array(sorted(keep, key=lambda k: -score[k]), np.int64)
        out.append((boxes[keep], cls[keep], score[keep], keep, boxes, score))
    return out


def device_nms(B, boxes, scores):
    """Class-agnostic NMS by the library's operator (tern.op.NonMaxSuppression, torchvision.ops.nms),
    a cross-check of the host's; indices best first."""
    if len(boxes) == 0:
        return np.zeros(0, np.int64)
    if B.is_tern:
        sel = B.lib.op.NonMaxSuppression(B.tensor(boxes[None]), B.tensor(scores[None, None]), B.long([len(boxes)]),
                                         B.tensor([NMS_IOU]))
        return B.numpy(sel)[:, 2].astype(np.int64)
    import torchvision
    return B.numpy(torchvision.ops.nms(B.tensor(boxes), B.tensor(scores), NMS_IOU)).astype(np.int64)


def factory(B):
    nn = B.nn

    # YOLOv3/v5-style: stride-2 convolutions instead of max pooling, SiLU; both smooth, so that
    # float rounding between the libraries cannot flip a ReLU or a pooling window's argmax
    def block(i, o, bn=True):
        layers = [nn.Conv2d(i, o, 3, stride=2, padding=1, bias=not bn)]
        if bn:
            layers.append(nn.BatchNorm2d(o))
        return layers + [nn.SiLU()]

    return nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 32, bn=False), nn.Conv2d(32, 5 + NC, 1))


def run(backend, seed):
    B = harness.backend(backend)
    F = B.F
    rng = harness.rng(seed)
    model = B.build(factory, seed)
    opt = B.optim.Adam(model.parameters(), lr=LR)
    timer = harness.StepTimer(B)
    losses = []
    for step in range(STEPS):
        x, objs = make_batch(rng, BATCH)
        tobj, idx, tbox, tcls = targets(objs)
        with timer.step():
            pred = model(B.input(x))  # [N, 5+NC, S, S]
            cells = pred.permute(0, 2, 3, 1).reshape(-1, 5 + NC)  # [N*S*S, 5+NC]
            loss_obj = F.binary_cross_entropy_with_logits(cells[:, 0], B.input(tobj))
            resp = cells[B.input(idx, 'int64')]
            loss_xy = F.mse_loss(resp[:, 1:3].sigmoid(), B.input(tbox[:, :2]))
            loss_wh = F.mse_loss(resp[:, 3:5], B.input(tbox[:, 2:]))
            loss_cls = F.cross_entropy(resp[:, 5:], B.input(tcls, 'int64'))
            loss = 5.0 * loss_obj + 5.0 * loss_xy + loss_wh + loss_cls
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(B.item(loss))
    model.eval()
    x, objs = make_batch(rng, 6)
    with B.no_grad():
        pred = B.numpy(model(B.tensor(x)))
    outputs = {}
    n_true = n_hit = 0
    for b, (boxes, cls, score, cells, cell_boxes, cell_scores) in enumerate(decode(pred)):
        dev = device_nms(B, cell_boxes, cell_scores)
        outputs['img%d_op_nms' % b] = dev
        outputs['img%d_op_nms_is_host_nms' % b] = bool(np.array_equal(dev, nms(cell_boxes, cell_scores, NMS_IOU)))
        outputs['img%d_cells' % b] = cells
        outputs['img%d_classes' % b] = cls.astype(np.int64)
        outputs['img%d_boxes' % b] = boxes.astype(np.float32)
        outputs['img%d_scores' % b] = score.astype(np.float32)
        gt = np.array([(cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2) for _, cx, cy, w, h in objs[b]])
        gcls = np.array([o[0] for o in objs[b]])
        n_true += len(gt)
        if len(boxes):
            ov = iou(gt, boxes)
            n_hit += int(np.sum((ov.max(1) >= 0.5) & (cls[ov.argmax(1)] == gcls)))
    outputs['recall_at_0.5'] = '%d/%d' % (n_hit, n_true)
    return harness.result(losses, harness.params_of(model), outputs, timer.median_ms())


if __name__ == '__main__':
    r = {b: run(b, 0) for b in harness.BACKENDS}
    print('losses tern ', np.round(r['tern']['losses'], 4))
    print('losses torch', np.round(r['torch']['losses'], 4))
    print({k: v for k, v in r['torch']['outputs'].items() if 'cells' in k or 'classes' in k or 'recall' in k})
    print('compare:', harness.compare_results(r['tern'], r['torch']) or 'agree',
          '; step ms tern %.2f torch %.2f' % (r['tern']['step_ms'], r['torch']['step_ms']))

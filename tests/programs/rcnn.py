"""Program 6: a Faster R-CNN-like two-stage detector on synthetic 32x32 images.

Rectangles (class 1: bright, class 2: dark; wide or tall) on noise. A small conv backbone (stride 4, an 8x8
feature map), an RPN head scoring 3 anchors per cell, then on the host with numpy: anchor labels
(IoU with the ground truth), anchor sampling, box decoding, top-k and non-maximum suppression of the
proposals, labelling of the kept proposals. RoI pooling of the data-dependent set of kept boxes is a
crop-and-resize by host-computed indices: a 4x4 grid of nearest feature cells per box (one Gather of
all boxes' cells from the flattened feature map), max-pooled to 2x2, then a classification and
box-regression head. Trained with Adam for 80 steps (one image each); at the end the detector runs on test images
and its kept boxes, classes and scores are compared.

tern gaps worked around here: tern.op.MaxRoiPool is an unknown operator, and tern.op.RoiAlign has
no gradient rule (it is used at test time only, checked against torchvision.ops.roi_align).
"""
import numpy as np

import harness
from harness import iou, nms

IMG = 32
STRIDE = 4
FEAT = IMG // STRIDE  # 8
ANCHOR_WH = np.array([[16.0, 8.0], [12.0, 12.0], [8.0, 16.0]])  # wide, square, tall
A = len(ANCHOR_WH)
NCLS = 3  # background, bright, dark
GRID = 4  # sample points per RoI side before the 2x2 max pool
STEPS = 80
LR = 0.005  # Adam (SGD leaves the RPN near chance in this many steps)
PRE_NMS, POST_NMS, NMS_IOU = 24, 8, 0.5
MIN_LOGIT = 0.0  # proposals need objectness > 0.5 (at least one kept)


# ---------------------------------------------------------------- host-side data and box code

def make_image(rng):
    img = rng.normal(0.0, 0.15, (1, IMG, IMG))
    boxes, labels = [], []
    for _ in range(int(rng.integers(1, 3))):
        for _try in range(50):
            cls = int(rng.integers(1, 3))
            long_side, short_side = int(rng.integers(12, 17)), int(rng.integers(6, 9))
            w, h = (long_side, short_side) if rng.random() < 0.5 else (short_side, long_side)
            x0, y0 = int(rng.integers(0, IMG - w + 1)), int(rng.integers(0, IMG - h + 1))
            b = np.array([x0, y0, x0 + w, y0 + h], np.float64)
            if all(iou(b[None], o[None])[0, 0] == 0.0 for o in boxes):
                break
        img[0, y0:y0 + h, x0:x0 + w] += 1.0 if cls == 1 else -1.0
        boxes.append(b)
        labels.append(cls)
    return img.astype(np.float32), np.array(boxes), np.array(labels, np.int64)


def make_anchors():
    c = (np.arange(FEAT) + 0.5) * STRIDE
    cy, cx = np.meshgrid(c, c, indexing='ij')
    ctr = np.stack([cx, cy], -1).reshape(-1, 1, 2)  # [cells, 1, 2], cells row-major (i, j)
    wh = ANCHOR_WH[None]
    return np.concatenate([ctr - wh / 2, ctr + wh / 2], -1).reshape(-1, 4)  # [(i, j, a), 4]


def encode(ref, gt):
    rw, rh = ref[:, 2] - ref[:, 0], ref[:, 3] - ref[:, 1]
    gw, gh = gt[:, 2] - gt[:, 0], gt[:, 3] - gt[:, 1]
    return np.stack([((gt[:, 0] + gt[:, 2]) - (ref[:, 0] + ref[:, 2])) / 2 / rw,
                     ((gt[:, 1] + gt[:, 3]) - (ref[:, 1] + ref[:, 3])) / 2 / rh,
                     np.log(gw / rw), np.log(gh / rh)], -1)


def decode(ref, d):
    rw, rh = ref[:, 2] - ref[:, 0], ref[:, 3] - ref[:, 1]
    cx, cy = (ref[:, 0] + ref[:, 2]) / 2 + d[:, 0] * rw, (ref[:, 1] + ref[:, 3]) / 2 + d[:, 1] * rh
    w, h = rw * np.exp(np.clip(d[:, 2], -2, 2)), rh * np.exp(np.clip(d[:, 3], -2, 2))
    return np.clip(np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1), 0, IMG)


def roi_indices(rois):
    """Flat feature-map cell of each of the GRID x GRID sample points of each RoI: [K * GRID * GRID]."""
    f = rois / STRIDE
    t = (np.arange(GRID) + 0.5) / GRID
    xs = f[:, 0:1] + t[None] * (f[:, 2:3] - f[:, 0:1])
    ys = f[:, 1:2] + t[None] * (f[:, 3:4] - f[:, 1:2])
    xi = np.clip(np.floor(xs), 0, FEAT - 1).astype(np.int64)
    yi = np.clip(np.floor(ys), 0, FEAT - 1).astype(np.int64)
    return (yi[:, :, None] * FEAT + xi[:, None, :]).reshape(-1)


# ---------------------------------------------------------------- the model (either library)

def factory(B):
    nn = B.nn

    class FasterRCNN(nn.Module):
        def __init__(self):
            super().__init__()
            # SiLU rather than ReLU: smooth, so float rounding between the libraries cannot flip a
            # unit on or off (which changes a gradient by far more than 1e-4 over the steps)
            self.backbone = nn.Sequential(
                nn.Conv2d(1, 8, 3, padding=1), nn.SiLU(),
                nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.SiLU(),
                nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.SiLU())
            self.rpn_conv = nn.Conv2d(16, 16, 3, padding=1)
            self.rpn_cls = nn.Conv2d(16, A, 1)
            self.rpn_reg = nn.Conv2d(16, 4 * A, 1)
            self.fc = nn.Linear(16 * 4, 64)
            self.cls = nn.Linear(64, NCLS)
            self.reg = nn.Linear(64, 4)

        def rpn(self, x):
            f = self.backbone(x)
            h = B.F.silu(self.rpn_conv(f))
            obj = self.rpn_cls(h).permute(0, 2, 3, 1).reshape(-1)  # [(i, j, a)]
            deltas = self.rpn_reg(h).permute(0, 2, 3, 1).reshape(-1, 4)
            return f, obj, deltas

        def head(self, f, idx, k):
            C = f.shape[1]
            cells = f.reshape(C, FEAT * FEAT)[:, idx]  # [C, K * GRID * GRID]
            crops = cells.reshape(C, k, GRID, GRID).permute(1, 0, 2, 3)
            pooled = B.F.max_pool2d(crops, 2).reshape(k, C * 4)
            h = B.F.silu(self.fc(pooled))
            return self.cls(h), self.reg(h)

    return FasterRCNN()


def proposals(B, anchors, obj, deltas):
    """Host side: decode, top PRE_NMS, NMS, at most POST_NMS boxes (a data-dependent count)."""
    s, d = B.numpy(obj).astype(np.float64), B.numpy(deltas).astype(np.float64)
    boxes = decode(anchors, d)
    ok = np.nonzero(((boxes[:, 2] - boxes[:, 0]) >= 2) & ((boxes[:, 3] - boxes[:, 1]) >= 2))[0]
    top = ok[np.argsort(-s[ok], kind='stable')[:PRE_NMS]]
    keep = top[nms(boxes[top], s[top], NMS_IOU)][:POST_NMS]
    keep = keep[:max(1, int(np.sum(s[keep] > MIN_LOGIT)))]
    return boxes[keep], s[keep]


def run(backend, seed):
    B = harness.backend(backend)
    F = B.F
    rng = harness.rng(seed)
    model = B.build(factory, seed)
    opt = B.optim.Adam(model.parameters(), lr=LR)
    anchors = make_anchors()
    train = [make_image(rng) for _ in range(STEPS)]
    test = [make_image(rng) for _ in range(3)]
    timer = harness.StepTimer(B)
    losses, n_props = [], []
    for img, gt, gl in train:
        with timer.step():
            f, obj, deltas = model.rpn(B.input(img[None]))
            # RPN targets on the host: IoU of anchors with the ground truth, sampled anchors
            ov = iou(anchors, gt)
            best = ov.max(1)
            pos = set(np.nonzero(best >= 0.5)[0].tolist()) | set(ov.argmax(0).tolist())
            neg = [i for i in np.nonzero(best < 0.3)[0].tolist() if i not in pos]
            pos = sorted(pos)
            neg = sorted(rng.choice(neg, size=min(len(neg), max(len(pos), 8)), replace=False).tolist())
            sel = np.array(pos + neg, np.int64)
            lab = np.array([1.0] * len(pos) + [0.0] * len(neg))
            loss_obj = F.binary_cross_entropy_with_logits(obj[B.long(sel)], B.tensor(lab))
            pidx = np.array(pos, np.int64)
            tgt = encode(anchors[pidx], gt[ov[pidx].argmax(1)])
            loss_rpn_reg = F.smooth_l1_loss(deltas[B.long(pidx)], B.tensor(tgt), beta=1.0 / 9)
            # proposals chosen on the host, plus the ground truth boxes
            props, _ = proposals(B, anchors, obj, deltas)
            rois = np.concatenate([props, gt])
            n_props.append(len(props))
            ovr = iou(rois, gt)
            labels = np.where(ovr.max(1) >= 0.5, gl[ovr.argmax(1)], 0).astype(np.int64)
            fg = np.nonzero(labels > 0)[0]
            logits, reg = model.head(f, B.long(roi_indices(rois)), len(rois))
            loss_cls = F.cross_entropy(logits, B.long(labels))
            rtgt = encode(rois[fg], gt[ovr[fg].argmax(1)])
            loss_reg = F.smooth_l1_loss(reg[B.long(fg)], B.tensor(rtgt), beta=1.0 / 9)
            loss = loss_obj + loss_rpn_reg + loss_cls + loss_reg
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append([B.item(t) for t in (loss_obj, loss_rpn_reg, loss_cls, loss_reg)])
    # inference on the test images: proposals, RoI head, background dropped, per-class NMS
    outputs = {'train_proposal_counts': np.array(n_props, np.int64)}
    with B.no_grad():
        for t, (img, gt, gl) in enumerate(test):
            f, obj, deltas = model.rpn(B.tensor(img[None]))
            props, _ = proposals(B, anchors, obj, deltas)
            logits, reg = model.head(f, B.long(roi_indices(props)), len(props))
            prob = B.numpy(F.softmax(logits, 1)).astype(np.float64)
            cls = prob.argmax(1)
            boxes = decode(props, B.numpy(reg).astype(np.float64))
            keep = [i for c in range(1, NCLS)
                    for i in np.nonzero(cls == c)[0][nms(boxes[cls == c], prob[cls == c, c], 0.3)]]
            keep = np.array(sorted(keep, key=lambda i: -prob[i, cls[i]]), np.int64)
            outputs['test%d_proposals' % t] = props.astype(np.float32)
            outputs['test%d_kept' % t] = keep
            outputs['test%d_classes' % t] = cls[keep].astype(np.int64)
            outputs['test%d_boxes' % t] = boxes[keep].astype(np.float32)
            outputs['test%d_scores' % t] = prob[keep, cls[keep]].astype(np.float32)
            # RoiAlign (forward only in tern) of the kept proposals on the feature map
            outputs['test%d_roi_align' % t] = B.numpy(roi_align(B, f, props))
    return harness.result([sum(l) for l in losses], harness.params_of(model), outputs, timer.median_ms())


def roi_align(B, f, boxes):
    bx = boxes.astype(np.float32)
    if B.is_tern:
        return B.lib.op.RoiAlign(f, B.tensor(bx), B.long(np.zeros(len(bx))), output_height=2, output_width=2,
                                 sampling_ratio=2, spatial_scale=1.0 / STRIDE, mode='avg',
                                 coordinate_transformation_mode='half_pixel')
    import torchvision
    rois = B.tensor(np.concatenate([np.zeros((len(bx), 1), np.float32), bx], 1))
    return torchvision.ops.roi_align(f, rois, (2, 2), 1.0 / STRIDE, 2, aligned=True)


if __name__ == '__main__':
    r = {b: run(b, 0) for b in harness.BACKENDS}
    print('losses tern ', np.round(r['tern']['losses'], 5))
    print('losses torch', np.round(r['torch']['losses'], 5))
    print('outputs', {k: v for k, v in r['torch']['outputs'].items() if 'kept' in k or 'classes' in k or 'counts' in k})
    print('compare:', harness.compare_results(r['tern'], r['torch']) or 'agree',
          '; step ms tern %.2f torch %.2f' % (r['tern']['step_ms'], r['torch']['step_ms']))

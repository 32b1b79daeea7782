"""Build /work/exp16/digits from sklearn's load_digits: stratified 70/30 split (random_state=0),
8x8 -> 32x32 with PIL BILINEAR, 0..16 -> 0..255 (x*255/16, rounded), saved as RGB PNGs."""
import json
from pathlib import Path
import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

out = Path("/work/exp16/digits")
d = load_digits()
X, y = d.images, d.target
idx = np.arange(len(y))
tr, te = train_test_split(idx, test_size=0.3, stratify=y, random_state=0)
for split, ids in (("train", tr), ("test", te)):
    for i in ids:
        img = np.clip(np.round(X[i] * 255.0 / 16.0), 0, 255).astype(np.uint8)
        im = Image.fromarray(img, "L").resize((32, 32), Image.BILINEAR).convert("RGB")
        p = out / split / str(y[i]); p.mkdir(parents=True, exist_ok=True)
        im.save(p / f"{i:04d}.png")
    print(split, len(ids))
json.dump({"source": "sklearn load_digits", "split": "stratified 70/30 random_state=0",
           "resize": "PIL bilinear 8->32", "scale": "x*255/16"}, open(out / "README.json", "w"))

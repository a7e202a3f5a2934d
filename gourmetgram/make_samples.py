"""Draw the three sample pictures that GourmetGram's /test page classifies.

Every sample is drawn here from shapes and colours, so the repository ships no photograph whose
licence anyone has to check. They are cartoons, not photographs: a trained Food-11 model may or
may not recognise them, and that is fine. What they exercise is the path from a file to a
prediction, which is what /test is for.

    python gourmetgram/make_samples.py        # writes gourmetgram/static/samples/*.jpg

The output is deterministic: fixed random seeds, fixed sizes, fixed JPEG settings. Running it
again with the same Pillow gives the same bytes, so the committed files only change when this
script does.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter

WIDTH, HEIGHT = 512, 384
# Shapes are drawn at SCALE times the final size and then shrunk: ImageDraw does not
# anti-alias, and shrinking with a good filter smooths the jagged edges away.
SCALE = 2
W, H = WIDTH * SCALE, HEIGHT * SCALE

SAMPLES_DIR = Path(__file__).resolve().parent / "static" / "samples"

Box = tuple[float, float, float, float]
RGB = tuple[int, int, int]


def ellipse_box(cx: float, cy: float, rx: float, ry: float) -> Box:
    return (cx - rx, cy - ry, cx + rx, cy + ry)


def blob(
    rng: random.Random, cx: float, cy: float, radius: float, wobble: float, points: int = 40
) -> list[tuple[float, float]]:
    """A closed, irregular outline around (cx, cy): a circle whose radius wanders smoothly."""
    # A few low-frequency sine waves with random phases give an organic, egg-white-like edge.
    waves = [(rng.uniform(0.5, 1.0) * wobble, k, rng.uniform(0, 2 * math.pi)) for k in (2, 3, 5)]
    outline = []
    for i in range(points):
        angle = 2 * math.pi * i / points
        r = radius * (1 + sum(a * math.sin(k * angle + phase) for a, k, phase in waves))
        outline.append((cx + r * math.cos(angle), cy + r * math.sin(angle)))
    return outline


def vertical_gradient(top: RGB, bottom: RGB) -> Image.Image:
    """A full-size background fading from `top` to `bottom`."""
    gradient = Image.new("RGB", (1, H))
    for y in range(H):
        t = y / (H - 1)
        gradient.putpixel((0, y), tuple(round(a + (b - a) * t) for a, b in zip(top, bottom, strict=True)))
    return gradient.resize((W, H))


def wood_table(rng: random.Random, base: RGB) -> Image.Image:
    """A wooden table top: a gradient with wavy darker grain lines."""
    table = vertical_gradient(base, tuple(max(0, c - 40) for c in base))
    draw = ImageDraw.Draw(table)
    for _ in range(26):
        y0 = rng.uniform(0, H)
        amplitude, period = rng.uniform(4, 14), rng.uniform(250, 600)
        shade = tuple(max(0, c - rng.randint(20, 45)) for c in base)
        line = [(x, y0 + amplitude * math.sin(x / period * 2 * math.pi)) for x in range(0, W + 20, 20)]
        draw.line(line, fill=shade, width=rng.randint(2, 5))
    return table.filter(ImageFilter.GaussianBlur(2))


def drop_shadow(canvas: Image.Image, box: Box, strength: int = 110, blur: int = 18) -> None:
    """Darken a soft elliptical patch under an object so it sits on the table, not floats."""
    mask = Image.new("L", canvas.size, 0)
    ImageDraw.Draw(mask).ellipse(box, fill=strength)
    mask = mask.filter(ImageFilter.GaussianBlur(blur))
    canvas.paste((0, 0, 0), (0, 0), mask)


def draw_soup(rng: random.Random) -> Image.Image:
    """A bowl of tomato soup seen from above at an angle, with cream and herbs, and a spoon."""
    img = wood_table(rng, (150, 100, 60))
    cx, cy = W * 0.47, H * 0.52
    drop_shadow(img, ellipse_box(cx + 25, cy + 60, 390, 250))
    draw = ImageDraw.Draw(img)
    # Bowl: the outer body below the rim, then the rim, then the soup inside it.
    draw.ellipse(ellipse_box(cx, cy + 40, 370, 250), fill=(226, 226, 220))
    draw.ellipse(ellipse_box(cx, cy, 380, 230), fill=(245, 245, 240), outline=(200, 200, 195), width=6)
    draw.ellipse(ellipse_box(cx, cy + 8, 320, 185), fill=(196, 62, 32))
    # A lighter ring near the edge of the soup, where it meets the bowl.
    draw.ellipse(ellipse_box(cx, cy + 8, 320, 185), outline=(222, 100, 56), width=14)
    # A swirl of cream: a spiral of short, fat line segments.
    spiral = [
        (cx + 12 * t * math.cos(t) * 1.5, cy + 8 + 12 * t * math.sin(t)) for t in [i * 0.12 for i in range(1, 110)]
    ]
    draw.line(spiral, fill=(250, 238, 220), width=16, joint="curve")
    # Herbs: small green flecks scattered over the soup surface.
    for _ in range(70):
        angle, dist = rng.uniform(0, 2 * math.pi), math.sqrt(rng.random())
        x, y = cx + 280 * dist * math.cos(angle), cy + 8 + 160 * dist * math.sin(angle)
        size = rng.uniform(4, 9)
        green = rng.choice([(60, 130, 40), (90, 160, 60), (40, 100, 30)])
        draw.ellipse(ellipse_box(x, y, size, size * 0.7), fill=green)
    # A spoon beside the bowl: a handle and a bowl-shaped head.
    draw.line([(W * 0.86, H * 0.18), (W * 0.95, H * 0.92)], fill=(190, 190, 198), width=26)
    draw.ellipse(ellipse_box(W * 0.855, H * 0.17, 42, 70), fill=(205, 205, 212), outline=(160, 160, 170), width=4)
    return img


def draw_fried_egg(rng: random.Random) -> Image.Image:
    """A fried egg in a black pan: an irregular white with a glossy yolk."""
    img = vertical_gradient((112, 118, 126), (70, 74, 80))  # a steel stove top
    cx, cy = W * 0.5, H * 0.5
    drop_shadow(img, ellipse_box(cx + 20, cy + 30, 420, 350), strength=140)
    draw = ImageDraw.Draw(img)
    # The pan: a grey rim, a near-black cooking surface, and a handle leaving to the left.
    draw.rectangle((0, cy - 38, cx - 300, cy + 38), fill=(35, 35, 38))
    draw.ellipse(ellipse_box(cx, cy, 400, 340), fill=(62, 62, 66))
    draw.ellipse(ellipse_box(cx, cy, 365, 305), fill=(28, 28, 30))
    # The white: an irregular blob with a faint browned, crispy edge.
    white_outline = blob(rng, cx + 10, cy + 5, 230, wobble=0.09)
    edge_outline = [(x + rng.uniform(-3, 3), y + rng.uniform(-3, 3)) for x, y in white_outline]
    draw.polygon(edge_outline, fill=(205, 170, 110))
    shrunk = [(cx + 10 + (x - cx - 10) * 0.94, cy + 5 + (y - cy - 5) * 0.94) for x, y in white_outline]
    draw.polygon(shrunk, fill=(250, 249, 244))
    # The yolk, a darker ring around it, and a highlight that makes it look glossy.
    yx, yy = cx - 20, cy - 15
    draw.ellipse(ellipse_box(yx, yy, 92, 86), fill=(232, 150, 20))
    draw.ellipse(ellipse_box(yx, yy, 84, 78), fill=(250, 182, 30))
    draw.ellipse(ellipse_box(yx - 28, yy - 30, 24, 16), fill=(255, 236, 160))
    # Coarse black pepper.
    for _ in range(40):
        angle, dist = rng.uniform(0, 2 * math.pi), rng.uniform(0.3, 0.9)
        x, y = cx + 200 * dist * math.cos(angle), cy + 200 * dist * math.sin(angle)
        draw.ellipse(ellipse_box(x, y, 3, 3), fill=(40, 35, 30))
    return img


def draw_bread(rng: random.Random) -> Image.Image:
    """A scored loaf of bread on a cutting board, with one slice cut off showing the crumb."""
    img = vertical_gradient((235, 228, 214), (205, 196, 180))  # a pale kitchen counter
    drop_shadow(img, (W * 0.06, H * 0.3, W * 0.96, H * 0.98), strength=90)
    draw = ImageDraw.Draw(img)
    # The cutting board, with a hole in its handle.
    draw.rounded_rectangle((W * 0.05, H * 0.25, W * 0.93, H * 0.92), radius=50, fill=(196, 150, 96))
    draw.rounded_rectangle((W * 0.93 - 20, H * 0.48, W * 0.99, H * 0.68), radius=30, fill=(196, 150, 96))
    draw.ellipse(ellipse_box(W * 0.965, H * 0.58, 14, 14), fill=(205, 196, 180))
    # The loaf: a dark crust outline, then the golden body, then a lighter top.
    loaf = ellipse_box(W * 0.44, H * 0.55, 330, 180)
    draw.ellipse(loaf, fill=(120, 66, 24))
    draw.ellipse(ellipse_box(W * 0.44, H * 0.53, 318, 166), fill=(176, 104, 42))
    draw.ellipse(ellipse_box(W * 0.44, H * 0.48, 280, 110), fill=(204, 138, 62))
    # Diagonal scores across the top, pale where the crust opened in the oven.
    for i in range(4):
        x = W * 0.44 - 190 + i * 125
        draw.line([(x - 40, H * 0.55 + 70), (x + 50, H * 0.55 - 80)], fill=(236, 196, 128), width=22)
    # A slice lying in front: crust ring, pale crumb, and a scatter of air holes.
    sx, sy = W * 0.8, H * 0.72
    draw.ellipse(ellipse_box(sx, sy, 120, 95), fill=(150, 86, 32))
    draw.ellipse(ellipse_box(sx, sy, 106, 82), fill=(244, 226, 186))
    for _ in range(45):
        angle, dist = rng.uniform(0, 2 * math.pi), math.sqrt(rng.random()) * 0.85
        x, y = sx + 100 * dist * math.cos(angle), sy + 76 * dist * math.sin(angle)
        r = rng.uniform(2, 7)
        draw.ellipse(ellipse_box(x, y, r, r * 0.8), fill=(222, 198, 150))
    # Crumbs on the board.
    for _ in range(30):
        x, y = rng.uniform(W * 0.1, W * 0.9), rng.uniform(H * 0.8, H * 0.9)
        r = rng.uniform(2, 5)
        draw.ellipse(ellipse_box(x, y, r, r), fill=(170, 110, 50))
    return img


# File name -> drawing function. The /test page offers exactly the files in static/samples.
SAMPLES: dict[str, Callable[[random.Random], Image.Image]] = {
    "soup.jpg": draw_soup,
    "fried_egg.jpg": draw_fried_egg,
    "bread.jpg": draw_bread,
}


def render(draw: Callable[[random.Random], Image.Image], seed: int) -> Image.Image:
    """Draw one sample at SCALE times the size, then shrink it: the shrink anti-aliases the shapes."""
    big = draw(random.Random(seed))
    return big.resize((WIDTH, HEIGHT), Image.LANCZOS)


def main() -> None:
    SAMPLES_DIR.mkdir(parents=True, exist_ok=True)
    for seed, (name, draw) in enumerate(SAMPLES.items()):
        path = SAMPLES_DIR / name
        # Fixed quality and no optimisation pass or metadata, so the bytes are reproducible.
        render(draw, seed).save(path, format="JPEG", quality=88, optimize=False, progressive=False)
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

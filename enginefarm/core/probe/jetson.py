"""A Jetson board, from the files it carries: model, L4T release → JetPack, the SoC's compute capability and
its shared memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Jetson SoC (device-tree "nvidia,tegraNNN") -> GPU compute capability.
TEGRA_CCS: dict[str, str] = {
    "tegra210": "5.3",  # Nano, TX1
    "tegra186": "6.2",  # TX2
    "tegra194": "7.2",  # Xavier
    "tegra234": "8.7",  # Orin
    "tegra264": "11.0",  # Thor (sm_101 until CUDA 13 renamed it sm_110)
}


# L4T release -> JetPack, matched on the longest leading run of version components, so a point
# release missing from the table still maps to its line (R36.4.7 -> 6.2, R35.9 -> 5.1).
L4T_JETPACK: dict[tuple[int, ...], str] = {
    (35,): "5.1",
    (35, 3, 1): "5.1.1",
    (35, 4, 1): "5.1.2",
    (35, 5, 0): "5.1.3",
    (35, 6, 0): "5.1.4",
    (36, 3): "6.0",
    (36, 4): "6.2",
    (36, 4, 0): "6.1",
    (36, 4, 3): "6.2",
    (36, 4, 4): "6.2.1",
    (38,): "7.0",
    (38, 2): "7.0",
}


@dataclass
class JetsonInfo:
    model: str
    l4t_release: str  # "36.4.3"; "" when the board has no /etc/nv_tegra_release
    jetpack: str | None
    compute_capability: str | None  # None for a SoC missing from TEGRA_CCS
    memory_mib: int | None = None  # system memory, which the Jetson GPU shares


def read_file(path: Path) -> str | None:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return None


def l4t_to_jetpack(l4t: str) -> str | None:
    """``36.4.3`` → ``6.2``; None for a release line the table does not know."""
    try:
        parts = tuple(int(p) for p in l4t.split("."))
    except ValueError:
        return None
    for n in range(len(parts), 0, -1):
        if parts[:n] in L4T_JETPACK:
            return L4T_JETPACK[parts[:n]]
    return None


def _parse_tegra_release(text: str) -> str | None:
    # "# R36 (release), REVISION: 4.3, GCID: ..." -> "36.4.3"
    head = text.lstrip("# \t").split(",")
    major = head[0].split()[0].lstrip("R") if head and head[0].split() else ""
    revision = next((p.split(":", 1)[1].strip() for p in head if p.strip().startswith("REVISION:")), "")
    if not major.isdigit():
        return None
    return f"{major}.{revision}" if revision else major


def _meminfo_mib(root: Path) -> int | None:
    for line in (read_file(root / "proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def probe_jetson(root: Path = Path("/")) -> JetsonInfo | None:
    """Return the Jetson board under ``root``, or None when this is not a Jetson."""
    release = read_file(root / "etc/nv_tegra_release")
    compatible = [c for c in (read_file(root / "proc/device-tree/compatible") or "").split("\0") if c]
    socs = [c.split(",", 1)[1] for c in compatible if c.startswith("nvidia,tegra")]
    if release is None and not socs:
        return None
    model = (read_file(root / "proc/device-tree/model") or "").strip("\0 \n") or "NVIDIA Jetson"
    l4t = (_parse_tegra_release(release) if release else None) or ""
    cc = next((TEGRA_CCS[s] for s in socs if s in TEGRA_CCS), None)
    return JetsonInfo(model, l4t, l4t_to_jetpack(l4t) if l4t else None, cc, _meminfo_mib(root))

"""The commands that fix what `gpuwhy check-env` finds missing, per distribution family.

Every fix is given for the three families gpuwhy supports (Debian, Ubuntu, RHEL and its
rebuilds); package repositories are named for the host's own release when it is of that
family, else for the newest release NVIDIA's CUDA repository serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FAMILIES = ("debian", "ubuntu", "rhel")
DEFAULT_REPO = {"debian": "debian12", "ubuntu": "ubuntu2404", "rhel": "rhel9"}
CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos"
_FAMILY_OF = {"ubuntu": "ubuntu", "debian": "debian", "rhel": "rhel", "centos": "rhel",
              "fedora": "rhel", "rocky": "rhel", "almalinux": "rhel"}


@dataclass(frozen=True)
class Distro:
    """What /etc/os-release says: ``family`` is debian, ubuntu, rhel or '' (unknown)."""

    family: str
    version_id: str
    pretty: str

    @classmethod
    def read(cls, path: str | Path = "/etc/os-release") -> Distro:
        values: dict[str, str] = {}
        try:
            for line in Path(path).read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    values[key.strip()] = value.strip().strip('"')
        except OSError:
            return cls("", "", "unknown (no /etc/os-release)")
        ids = [values.get("ID", "")] + values.get("ID_LIKE", "").split()
        family = next((_FAMILY_OF[i] for i in ids if i in _FAMILY_OF), "")
        return cls(family, values.get("VERSION_ID", ""), values.get("PRETTY_NAME", "unknown"))

    def cuda_repo(self, family: str) -> str:
        """NVIDIA's repository name for ``family``: debian12, ubuntu2204, rhel9, ..."""
        if family == self.family and self.version_id:
            major = self.version_id.split(".")[0]
            return f"ubuntu{self.version_id.replace('.', '')}" if family == "ubuntu" \
                else f"{family}{major}"
        return DEFAULT_REPO[family]


def _arch(machine: str) -> str:
    return "sbsa" if machine == "aarch64" else machine


def _apt_cuda_repo(repo: str, arch: str) -> str:
    return (f"wget -qO /tmp/cuda-keyring.deb {CUDA_REPO}/{repo}/{arch}/cuda-keyring_1.1-1_all.deb"
            " && dpkg -i /tmp/cuda-keyring.deb && apt-get update")


def _dnf_cuda_repo(repo: str, arch: str) -> str:
    return f"dnf config-manager --add-repo {CUDA_REPO}/{repo}/{arch}/cuda-{repo}.repo"


def same_everywhere(command: str) -> dict[str, str]:
    return {family: command for family in FAMILIES}


def nvidia_driver(distro: Distro, machine: str) -> dict[str, str]:
    arch = _arch(machine)
    rhel = distro.cuda_repo("rhel")
    return {
        "debian": f"{_apt_cuda_repo(distro.cuda_repo('debian'), arch)} && apt-get install -y "
                  "linux-headers-$(uname -r) cuda-drivers && reboot",
        "ubuntu": "apt-get install -y ubuntu-drivers-common && ubuntu-drivers install --gpgpu"
                  " && reboot",
        "rhel": f"dnf install -y https://dl.fedoraproject.org/pub/epel/epel-release-latest-"
                f"{rhel.removeprefix('rhel')}.noarch.rpm && {_dnf_cuda_repo(rhel, arch)} && "
                "dnf install -y kernel-devel-$(uname -r) cuda-drivers && reboot",
    }


def nvml_library(driver_major: int | None) -> dict[str, str]:
    branch = driver_major or "$(cut -d. -f1 /sys/module/nvidia/version)"
    return {
        "debian": "apt-get install -y libnvidia-ml1",
        "ubuntu": f"apt-get install -y libnvidia-compute-{branch}",
        "rhel": "dnf install -y /usr/lib64/libnvidia-ml.so.1",
    }


def dcgm(distro: Distro, machine: str, cuda_major: int) -> dict[str, str]:
    arch = _arch(machine)
    package = f"datacenter-gpu-manager-4-cuda{cuda_major}"
    start = "systemctl enable --now nvidia-dcgm"
    return {
        "debian": f"{_apt_cuda_repo(distro.cuda_repo('debian'), arch)} && "
                  f"apt-get install -y {package} && {start}",
        "ubuntu": f"{_apt_cuda_repo(distro.cuda_repo('ubuntu'), arch)} && "
                  f"apt-get install -y {package} && {start}",
        "rhel": f"{_dnf_cuda_repo(distro.cuda_repo('rhel'), arch)} && "
                f"dnf install -y {package} && {start}",
    }


KERNEL_WITH_BTF = {
    "debian": "apt-get install -y linux-image-$(dpkg --print-architecture) && reboot",
    "ubuntu": "apt-get install -y linux-generic && reboot",
    "rhel": "dnf install -y kernel && reboot",
}
KERNEL_HEADERS = {
    "debian": "apt-get install -y linux-headers-$(uname -r)",
    "ubuntu": "apt-get install -y linux-headers-$(uname -r)",
    "rhel": "dnf install -y kernel-devel-$(uname -r)",
}
BCC = {
    "debian": "apt-get install -y python3-bpfcc",
    "ubuntu": "apt-get install -y python3-bpfcc",
    "rhel": "dnf install -y python3-bcc",
}
PYTHON = {
    "debian": "apt-get install -y python3 python3-venv",
    "ubuntu": "apt-get install -y python3.11 python3.11-venv",
    "rhel": "dnf install -y python3.11",
}
TRACEFS = same_everywhere(
    "mount -t tracefs tracefs /sys/kernel/tracing && "
    "echo 'tracefs /sys/kernel/tracing tracefs defaults 0 0' >> /etc/fstab")
BPF_CAPABILITIES = same_everywhere(
    "sudo gpuwhy check-env   # as a service, systemd/gpuwhy-probes.service grants them")

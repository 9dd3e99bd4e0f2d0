#!/usr/bin/env bash
# Compile-only check of the CUDA backend with CUDA 12 for the V100 (sm_70), so that a construct
# only CUDA 13 accepts cannot slip into csrc/cuda: `python setup.py cuda_compile` (setup.py's
# own toolkit checks, architecture validation and nvcc flags, -Werror included) with
# NEEDLE_CUDA_ARCH=70 and a CUDA 12 toolkit: $CUDA12_HOME, else the newest /usr/local/cuda-12*,
# else Debian trixie's CUDA 12.4 packages (non-free), pinned below by version and SHA256,
# downloaded and unpacked into build/cuda12/debian without installing anything into the system
# (CI's machine stays as it was; bookworm's own toolkit is 11.8, too old). PyPI has no
# substitute: the nvidia-cuda-nvcc-cu12 wheels ship ptxas, libnvvm and headers but no nvcc
# driver, cudafe++ or cicc. Of Debian's packages, nvidia-cuda-toolkit brings nvcc, cicc (NVVM
# linked in), cudafe++, ptxas, fatbinary and libdevice; nvidia-cuda-dev (934 MB, nearly all of
# it static libraries) only its headers and libcudart_static.a (which setup.py requires of a
# toolkit), read out of the package's stream, which stops there instead of unpacking 2.5 GB.
# The unpacked tree is kept and reused; the .deb files are deleted. Without the network (or
# once the mirror no longer has the pinned versions: then update the pins from trixie's
# Packages index) it says SKIPPED and why, and exits 0. Prints how long it took.
#   bash tests/cuda12_compile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
out=build/cuda12
mirror=http://deb.debian.org/debian
# name, path under the mirror, SHA256 (Debian trixie non-free, amd64: CUDA 12.4.1).
packages=(
    "nvidia-cuda-toolkit
    pool/non-free/n/nvidia-cuda-toolkit/nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb
    cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319"
    "nvidia-cuda-dev
    pool/non-free/n/nvidia-cuda-toolkit/nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb
    d846838f914a0176948d48a8bcade5d6dbcccb5c9374343f6475f5503f173ee0"
)
# What nvcc needs of nvidia-cuda-dev, in the order of its data archive (tar stops after the
# last one named).
dev_members=(./usr/include ./usr/lib/x86_64-linux-gnu/libcudart_static.a)

skip() {
    echo "cuda12_compile: SKIPPED: $* ($((SECONDS - start)) s)"
    exit 0
}

# Debian's nvcc reads bin/nvcc.profile beside it, a link to /etc/nvcc.profile naming /usr paths;
# this one names the unpacked tree instead, relative to the nvcc binary's directory ($(_HERE_)).
# Its bin/ holds Debian's gcc and g++ wrappers, which pick a gcc that CUDA 12.4 supports.
write_profile() {
    cat >"$1" <<'EOF'
# nvcc.profile of the CUDA 12.4 unpacked from Debian's packages by tests/cuda12_compile.sh
NVVMIR_LIBRARY_DIR = $(_HERE_)/../libdevice
PATH += $(_HERE_):$(_HERE_)/../../../bin:
INCLUDES += "-I$(_HERE_)/../include" $(_SPACE_)
LIBRARIES =+ $(_SPACE_) "-L$(_HERE_)/../lib64"
EOF
}

# Downloads, verifies and unpacks the pinned packages into $out/debian (kept when the stamp in it
# names the same packages), and makes the directory of Debian's nvcc look like a toolkit to
# setup.py: include/ and lib64/ links beside its bin/.
unpack_debian() {
    local deb=$out/debian stamp tmp downloads entry name path sha file url got err
    stamp=$(printf '%s\n' "${packages[@]}")
    if [ -f "$deb/.packages" ] && [ "$(cat "$deb/.packages")" = "$stamp" ]; then
        return
    fi
    tmp=$out/debian.partial
    downloads=$out/downloads
    rm -rf "$tmp" "$downloads"
    mkdir -p "$tmp" "$downloads"
    for entry in "${packages[@]}"; do
        read -r -d '' name path sha <<<"$entry" || true
        file=$downloads/$name.deb
        url=$mirror/$path
        # Hashed as it arrives (sha256sum of nvidia-cuda-dev alone takes seconds).
        if ! got=$(curl -fsS --retry 2 --connect-timeout 20 "$url" 2>"$downloads/curl.err" |
            tee "$file" | sha256sum); then
            err=$(cat "$downloads/curl.err")
            rm -rf "$tmp" "$downloads"
            case $err in
            *404*) err="$err (the mirror has moved on: update the pins above)" ;;
            esac
            skip "could not download $name ($url): $err"
        fi
        if [ "${got%% *}" != "$sha" ]; then
            rm -rf "$tmp" "$downloads"
            echo "cuda12_compile: $url has SHA256 ${got%% *}, not the pinned $sha" >&2
            exit 1
        fi
        case $name in
        nvidia-cuda-dev)
            # dpkg-deb dies of SIGPIPE when tar stops early: tar's status and the files
            # checked below judge the extraction (the package's checksum was checked above).
            { dpkg-deb --fsys-tarfile "$file" 2>/dev/null || true; } |
                tar -x -C "$tmp" --occurrence "${dev_members[@]}"
            ;;
        *) dpkg-deb -x "$file" "$tmp" ;;
        esac
        rm -f "$file"
    done
    rm -rf "$downloads"
    local kit=$tmp/usr/lib/nvidia-cuda-toolkit
    rm -f "$kit/bin/nvcc.profile"
    write_profile "$kit/bin/nvcc.profile"
    ln -s ../../include "$kit/include"
    ln -s ../x86_64-linux-gnu "$kit/lib64"
    for file in bin/nvcc bin/cicc libdevice/libdevice.10.bc include/cuda_runtime.h \
        include/crt/host_config.h lib64/libcudart_static.a; do
        if [ ! -f "$kit/$file" ]; then
            echo "cuda12_compile: the unpacked packages lack $file" >&2
            exit 1
        fi
    done
    echo "$stamp" >"$tmp/.packages"
    rm -rf "$deb"
    mv "$tmp" "$deb"
    echo "cuda12_compile: unpacked CUDA 12.4 from Debian's packages into $deb" \
        "($(du -sh "$deb" | cut -f1), $((SECONDS - start)) s)"
}

home=${CUDA12_HOME:-}
if [ -z "$home" ]; then
    for dir in /usr/local/cuda-12*; do
        [ -x "$dir/bin/nvcc" ] && home=$dir
    done
fi
if [ -z "$home" ]; then
    unpack_debian
    home=$PWD/$out/debian/usr/lib/nvidia-cuda-toolkit
fi
echo "cuda12_compile: $("$home/bin/nvcc" --version | grep release)"
CUDA_HOME=$home NEEDLE_CUDA=1 NEEDLE_STRICT=1 NEEDLE_CUDA_ARCH=70 \
    python setup.py -q cuda_compile --build-temp "$out"
echo "cuda12_compile: csrc/cuda/*.cu compile for sm_70 with CUDA 12 ($((SECONDS - start)) s)"

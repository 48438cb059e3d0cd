#!/usr/bin/env bash
# Build enroot's release packages (enroot, enroot+caps) from the pristine upstream source archive,
# as root in a throwaway Debian 12 container (the stand-in node image). Only the build invocation
# is adapted; enroot's source is used as released.
#
#   enroot-deb.sh ARCHIVE OUTDIR
#
# What differs from upstream's release build (pkg/debbuild: `make deb` under debuild on Ubuntu):
# - The archive lacks its three git submodules. deps/makeself: Debian's makeself 2.4.5 (the
#   version upstream pins) is installed as enroot-makeself. deps/linux-headers: Debian's
#   linux-libc-dev. deps/musl: not built; FORCE_GLIBC=1 links the helpers against glibc.
# - glibc 2.36 has no strlcpy/strlcat (musl has them): Debian's libbsd provides them.
# - The .debs are assembled with dpkg-deb from `make install` into the layout upstream's
#   debian/rules gives (prefix /usr, /etc/enroot, the AppArmor profile in /etc/apparmor.d), with
#   the dependencies of upstream's pkg/deb/control and its enroot+caps maintainer scripts.
set -euo pipefail

archive=$1
out=$2

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends gcc make libc6-dev linux-libc-dev libbsd-dev makeself dpkg-dev >/dev/null

work=$(mktemp -d)
tar -xzf "$archive" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'enroot-*')
cd "$src"
version=$(sed -n 's/^VERSION *:= *//p' Makefile)
full="${version}-1"

install -D -m 755 /usr/bin/makeself deps/dist/makeself/bin/enroot-makeself
touch deps/makeself/.stamp deps/linux-headers/.stamp
flags=(FORCE_GLIBC=1 "LDLIBS=-l:libbsd.a -l:libbsd.so" prefix= exec_prefix=/usr datarootdir=/usr/share)
# The standard (not hardened) flavour's flags, as in pkg/debbuild; libbsd's overlay headers.
export CPPFLAGS="-DALLOW_SPECULATION -DINHERIT_FDS -isystem /usr/include/bsd -DLIBBSD_OVERLAY"
make "${flags[@]}" >/dev/null
root="$work/enroot"
make install "${flags[@]}" DESTDIR="$root" >/dev/null
install -d "$root/etc/apparmor.d"
mv "$root/usr/share/enroot/apparmor.profile" "$root/etc/apparmor.d/enroot"
install -D -m 644 LICENSE "$root/usr/share/doc/enroot/copyright"

# Library dependencies as debhelper computes them.
mkdir -p debian
printf 'Source: enroot\n\nPackage: enroot\nArchitecture: any\n' >debian/control
shlibs=$(dpkg-shlibdeps -O "$root"/usr/bin/enroot-{aufs2ovlfs,mksquashovlfs,mount,switchroot,nsenter} 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
# Upstream's run-time dependencies: the Depends field of the enroot stanza, without its comments.
depends=$(awk '/^Package: #PACKAGE#$/ {p = 1} p && /^Depends:/ {d = 1; sub(/^Depends:/, "")} d && /^[A-Z][a-z]*:/ && !/^Depends:/ {exit}
    d && !/^#/ {print}' pkg/deb/control | tr -d '\n' | sed -e 's/\${[^}]*},\? *//g' -e 's/^ *//' -e 's/, *$//' -e 's/ \+/ /g')
recommends=$(sed -n '/^Package: #PACKAGE#$/,/^$/s/^Recommends: //p' pkg/deb/control)
suggests=$(sed -n '/^Package: #PACKAGE#$/,/^$/s/^Suggests: //p' pkg/deb/control)

control() {  # NAME DEPENDS SIZE_DIR DESCRIPTION
    cat <<EOF
Package: $1
Version: $full
Architecture: amd64
Maintainer: NVIDIA CORPORATION <cudatools@nvidia.com>
Installed-Size: $(du -sk --exclude=DEBIAN "$3" | cut -f1)
Depends: $2
Section: utils
Priority: optional
Homepage: https://github.com/NVIDIA/enroot
Description: $4
EOF
}

install -d "$root/DEBIAN"
{
    control enroot "$shlibs, $depends" "$root" "Unprivileged container sandboxing utility"
    echo "Recommends: $recommends"
    echo "Suggests: $suggests"
} >"$root/DEBIAN/control"
(cd "$root" && find etc -type f | sed 's|^|/|' | sort) >"$root/DEBIAN/conffiles"

caps="$work/caps"
install -D -m 644 LICENSE "$caps/usr/share/doc/enroot+caps/copyright"
install -d "$caps/DEBIAN"
control "enroot+caps" "enroot (= $full), libcap2-bin" "$caps" \
    "Unprivileged container sandboxing utility (extra capabilities)" >"$caps/DEBIAN/control"
for script in postinst prerm; do
    sed -e 's/#PACKAGE#/enroot+caps/g' -e '/^#DEBHELPER#$/d' "pkg/deb/PACKAGE+caps.$script" >"$caps/DEBIAN/$script"
    chmod 755 "$caps/DEBIAN/$script"
done

mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$out/enroot_${full}_amd64.deb" >/dev/null
dpkg-deb --root-owner-group -Zxz --build "$caps" "$out/enroot+caps_${full}_amd64.deb" >/dev/null
ls "$out"

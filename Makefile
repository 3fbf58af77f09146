# tiermem: build and install the C library, header, pkg-config file and the `tiermem` command.
#   make                      build everything (release)
#   make install PREFIX=/opt  install to a prefix (default /usr/local); DESTDIR is honoured
#   make uninstall PREFIX=... remove what install put there
PREFIX  ?= /usr/local
DESTDIR ?=
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
REL     := target/release

.PHONY: all build install uninstall test demo
all: build

build:
	cargo build --release --workspace

install: build
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 0755 $(REL)/libtiermem.so $(DESTDIR)$(PREFIX)/lib/libtiermem.so
	install -m 0644 $(REL)/libtiermem.a $(DESTDIR)$(PREFIX)/lib/libtiermem.a
	install -m 0644 crates/capi/include/tiermem.h $(DESTDIR)$(PREFIX)/include/tiermem.h
	install -m 0755 $(REL)/tiermem $(DESTDIR)$(PREFIX)/bin/tiermem
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' crates/capi/tiermem.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/tiermem.pc

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/lib/libtiermem.so $(DESTDIR)$(PREFIX)/lib/libtiermem.a \
	  $(DESTDIR)$(PREFIX)/include/tiermem.h $(DESTDIR)$(PREFIX)/bin/tiermem \
	  $(DESTDIR)$(PREFIX)/lib/pkgconfig/tiermem.pc

test:
	bash scripts/test.sh

demo:
	bash scripts/demo.sh

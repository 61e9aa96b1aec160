# Kvasir — one non-recursive Makefile.
#   make            build build/kvd and build/kvctl
#   make test       set-up, build, run the suite, then again under ASan+UBSan, then a bounded fuzz run
#   make check      the tests tests/tests.list marks "check" (every C unit test, the fast shell
#                   tests), normal build: no set-up, minutes
#   make demo       set-up, build, run the demo (tests/demo.sh)
#   make bench      set-up, build, run the benchmarks (tests/bench.sh)
#   make fuzz       run the fuzz targets until interrupted (FUZZ_TIME=seconds to bound)
#   make install    kvd, kvctl, the systemd unit, an example config and the docs
#                   (PREFIX=/usr/local, DESTDIR=, SYSCONFDIR=/etc; docs/service.md)
# SAN=1 builds into build/asan with -fsanitize=address,undefined,float-cast-overflow.  V=1 shows commands.

CC      ?= gcc
SAN     ?= 0
FUZZ    ?= 0
WERROR  := -Werror
ifeq ($(FUZZ),1)
  # libFuzzer build (tests/fuzz.sh): clang, every object instrumented, warnings not fatal
  # (gcc is the compiler the code is held to).
  CC      := clang-14
  B       := build/fuzz
  OPT     := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
             -fno-sanitize-recover=undefined
  LDSAN   := -fsanitize=fuzzer,address,undefined
  WERROR  :=
else ifeq ($(SAN),1)
  B       := build/asan
  # float-cast-overflow: gcc leaves it out of "undefined" (a double outside an integer's range)
  OPT     := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow \
             -fno-sanitize-recover=undefined,float-cast-overflow
  LDSAN   := -fsanitize=address,undefined,float-cast-overflow
else
  B       := build
  OPT     := -O2 -g
  LDSAN   :=
endif

# ---- arm64 (docs/arm64.md) ----
# make ARCH=aarch64 (or CROSS=aarch64-linux-gnu-) cross-builds into build/arm64 with Debian's
# aarch64-linux-gnu-gcc against the arm64 multiarch libraries (scripts/setup-arm64.sh installs
# them); pkg-config then reads the arm64 .pc files, so an optional library that has no arm64
# form is left out as on any host without it. make test-arm64 builds that (and the x86 kvd
# and kvctl the rings compare with) and runs tests/integration/test-arm64.sh (the kernel tests, model
# tests, every reference case and the rings under qemu-user).
HOST_ARCH  := $(shell uname -m)
ARCH       ?= $(HOST_ARCH)
PKG_CONFIG ?= pkg-config
ifeq ($(ARCH),arm64)
  override ARCH := aarch64
endif
ifneq ($(CROSS),)
  override ARCH := aarch64
endif
ifeq ($(ARCH),aarch64)
  ifneq ($(HOST_ARCH),aarch64)
    CROSS      ?= aarch64-linux-gnu-
    CC         := $(CROSS)gcc
    AR         := $(CROSS)ar
    PKG_CONFIG := PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig pkg-config
    ifeq ($(SAN),1)
      B := build/arm64-asan
    else
      B := build/arm64
    endif
  endif
endif
# kernels/cpu/simd_neon.c is aarch64's; x86's simd_avx*.c compile to empty tables elsewhere.
ISA_neon   :=
NOT_THIS_ARCH := $(if $(filter aarch64,$(ARCH)),,kernels/cpu/simd_neon.c)

.DEFAULT_GOAL := all
test-arm64:
	@scripts/setup-arm64.sh
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory ARCH=aarch64 tests
	@KV_ARM64_FULL=1 tests/integration/test-arm64.sh build build/arm64
.PHONY: test-arm64
# ---- end arm64 ----

CFLAGS_ALL := -std=c11 -D_GNU_SOURCE -Wall -Wextra $(WERROR) -Wno-unused-parameter -pthread -I. \
              -I/usr/include/postgresql \
              -MMD -MP $(OPT) $(CFLAGS)
LDLIBS_ALL := -luv -lssl -lcrypto -lopenblas -lzstd -lwslay -lhttp_parser -lcurl -lcjson \
              -lsqlite3 -lpq -lpcre2-8 -lclblast -lOpenCL -lm -pthread $(LDLIBS)

# systemd's readiness notifications (kvd/service.c) when libsystemd is there; without it kvd
# still runs under systemd as Type=simple.
ifneq ($(shell $(PKG_CONFIG) --exists libsystemd 2>/dev/null && echo y),)
  CFLAGS_ALL += -DKV_HAVE_SYSTEMD
  LDLIBS_ALL += -lsystemd
endif

ifeq ($(V),1)
  Q :=
else
  Q := @
endif

# Per-file instruction-set flags for runtime-dispatched kernels (one binary runs everywhere).
ifeq ($(ARCH),x86_64)
  ISA_avx2   := -mavx2 -mfma -mf16c
  ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mavx2 -mfma -mf16c
endif

# Source lists follow folders: the shared modules make libkvasir.a; each program is its folder(s).
srcs_in     = $(wildcard $(addsuffix /*.c,$(1)))
LIB_DIRS   := util wtype gguf kernels kernels/ref kernels/cpu kernels/opencl model planner net ring seed api
KVD_DIRS   := kvd kvd/stage kvd/market kvd/relay kvd/join
KVCTL_DIRS := kvctl
LIB_SRCS   := $(filter-out $(NOT_THIS_ARCH),$(call srcs_in,$(LIB_DIRS)))
KVD_SRCS   := $(call srcs_in,$(KVD_DIRS))
KVCTL_SRCS := $(call srcs_in,$(KVCTL_DIRS))
# The suite's C files are those tests/tests.list names (the one list tests/run.sh reads too):
# C unit tests in tests/unit/, test tools in tests/tools/, fuzz targets in tests/fuzz/.
TEST_LIST := $(addprefix tests/,$(shell sed 's/\#.*//' tests/tests.list | awk 'NF { print $$1 }'))
TEST_SRCS := $(filter tests/unit/test-%.c,$(TEST_LIST))
TOOL_SRCS := $(filter tests/tools/tool-%.c,$(TEST_LIST))
FUZZ_SRCS := $(filter tests/fuzz/fuzz-%.c,$(TEST_LIST))

# Files compiled in as C arrays (the embed recipe below): the OpenCL kernels
# (kernels/opencl/*.cl) into the library, the market's coverage page into kvd.
CL_SRCS    := $(wildcard kernels/opencl/*.cl)
CL_GEN     := $(B)/gen/kern_cl.c
PAGE_GEN   := $(B)/gen/market_page.c
LIB_OBJS   := $(LIB_SRCS:%.c=$(B)/obj/%.o) $(B)/obj/gen/kern_cl.o
KVD_OBJS   := $(KVD_SRCS:%.c=$(B)/obj/%.o) $(B)/obj/gen/market_page.o
KVCTL_OBJS := $(KVCTL_SRCS:%.c=$(B)/obj/%.o)
LIB        := $(B)/libkvasir.a
# The daemon's roles as an archive too, so tests link the relay or the stage; its main() is
# never taken from it (a test defines its own).
KVD_LIB    := $(B)/libkvd.a
# Every test and tool binary goes into $(B)/tests/ under its own name, whatever its folder.
TESTS      := $(TEST_SRCS:tests/unit/%.c=$(B)/tests/%)
# The test build of kvd: kvd's own main and roles (libkvd.a) plus the network tests' stand-in
# compute backend, which adds `kvd stage --stub` (tests/tools/stub_backend.c).
KVD_STUB   := $(B)/tests/kvd-stub
TOOLS      := $(TOOL_SRCS:tests/tools/%.c=$(B)/tests/%)
FUZZERS    := $(FUZZ_SRCS:tests/fuzz/%.c=$(B)/%)

.PHONY: all tests test check demo bench fuzz fuzzers fuzz-objs setup setup-test clean install uninstall
all: $(B)/kvd $(B)/kvctl
tests: all $(TESTS) $(TOOLS) $(KVD_STUB)

# The version both programs print (--version): VERSION plus the commit when built from git.
# $(B)/.version changes only when the string does, so only the two mains rebuild.
KV_VERSION := $(shell cat VERSION 2>/dev/null || echo 0)$(shell git rev-parse --short HEAD 2>/dev/null | sed 's/^/+g/')
$(B)/.version: FORCE
	@mkdir -p $(B)
	@echo '$(KV_VERSION)' | cmp -s - $@ || echo '$(KV_VERSION)' > $@
$(B)/obj/kvd/main.o $(B)/obj/kvctl/main.o: $(B)/.version
$(B)/obj/kvd/main.o $(B)/obj/kvctl/main.o: CFLAGS_ALL += -DKV_VERSION='"$(KV_VERSION)"'
.PHONY: FORCE
FORCE:

# The fuzz build leaves the SIMD kernels uninstrumented: no target fuzzes them (fuzz-market
# links the model only for the market's verifier), and clang's ASan+UBSan+fuzzer
# instrumentation of their always-inlined bodies took ~110 s (AVX2) and ~155 s (AVX-512) a
# file against ~4 s without; build/asan runs the kernels' tests under the sanitizers.
ifeq ($(FUZZ),1)
$(B)/obj/kernels/cpu/simd_%.o: CFLAGS_ALL := $(filter-out -fsanitize=% -fno-sanitize-recover=%,$(CFLAGS_ALL))
endif
$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC $<")
	$(Q)$(CC) $(CFLAGS_ALL) $(ISA_$(lastword $(subst _, ,$(basename $(notdir $<))))) -c $< -o $@

# $(call embed,NAME): the prerequisites' bytes as the array NAME (with a NUL after them) and
# their length as NAME_len, written to $@.
define embed
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GEN $@")
	$(Q){ echo '/* generated from $^ by the Makefile */'; \
	  echo 'const unsigned char $(1)[] = {'; cat $^ | xxd -i; \
	  echo ', 0};'; echo 'const unsigned long $(1)_len = sizeof $(1) - 1;'; } > $@.tmp
	$(Q)mv $@.tmp $@
endef

$(CL_GEN): $(CL_SRCS)
	$(call embed,kern__cl_src)

$(PAGE_GEN): kvd/market/page.html
	$(call embed,kvd_market__page)

$(B)/obj/gen/%.o: $(B)/gen/%.c
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS_ALL) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(KVD_LIB): $(KVD_OBJS)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(B)/kvd: $(KVD_OBJS) $(LIB)
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(LDSAN) -o $@ $^ $(LDLIBS_ALL)

$(B)/kvctl: $(KVCTL_OBJS) $(LIB)
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(LDSAN) -o $@ $^ $(LDLIBS_ALL)

$(B)/tests/test-%: $(B)/obj/tests/unit/test-%.o $(KVD_LIB) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(LDSAN) -o $@ $^ $(LDLIBS_ALL)

$(B)/tests/tool-%: $(B)/obj/tests/tools/tool-%.o $(KVD_LIB) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(LDSAN) -o $@ $^ $(LDLIBS_ALL)

$(KVD_STUB): $(B)/obj/tests/tools/stub_backend.o $(KVD_LIB) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(LDSAN) -o $@ $^ $(LDLIBS_ALL)

# libFuzzer targets: make FUZZ=1 fuzzers (tests/fuzz.sh does this). A target links the objects
# of the module folders (the library's or kvd's) its source names in "fuzz-modules: gguf net"
# comments, one or more lines (see below when absent), so one module that clang cannot build
# does not stop the others' fuzzing; an entry with a slash is a file prefix ("model/tok" =
# model/tok*.c, "kvd/market/st" = kvd/market/st*.c, "gen/kern_cl" = the embedded OpenCL source).
fuzzers: $(FUZZERS)

fuzz_mods = $(shell sed -n 's/.*fuzz-modules:\([a-z0-9_/ ]*\).*/\1/p' tests/fuzz/fuzz-$(1).c)
fuzz_objs = $(if $(strip $(call fuzz_mods,$(1))),$(filter $(foreach m,$(call fuzz_mods,$(1)),$(if $(findstring /,$(m)),$(B)/obj/$(m)%,$(B)/obj/$(m)/%)),$(LIB_OBJS) $(KVD_OBJS)),$(B)/libfuzz.a)
# Without the comment a target links $(B)/libfuzz.a: the library objects clang could build
# (tests/fuzz.sh first compiles them with make -k fuzz-objs; gcc-only SIMD code may fail),
# from which the linker takes only the members the target uses.
fuzz-objs: $(LIB_OBJS) $(FUZZ_SRCS:%.c=$(B)/obj/%.o)
$(B)/libfuzz.a: $(wildcard $(LIB_OBJS))
	$(Q)rm -f $@ && ar rcs $@ $^
.SECONDEXPANSION:
$(B)/fuzz-%: $(B)/obj/tests/fuzz/fuzz-%.o $$(call fuzz_objs,$$*)
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(LDSAN) -o $@ $^ $(LDLIBS_ALL)

# `make demo` installs what building and running need; `make test`, `make bench` (and
# fuzz) also what the suite uses (scripts/setup.sh --test).
setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

# The builds take every CPU unless make was given -j itself; tests/run.sh runs the tests side
# by side (TEST_JOBS, default twice the CPUs; docs/hacking.md).
NPROC  := $(shell nproc 2>/dev/null || echo 2)
JFLAG   = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(NPROC))

test: setup-test
	@$(MAKE) --no-print-directory $(JFLAG) tests
	@$(MAKE) --no-print-directory $(JFLAG) SAN=1 tests
	@tests/run.sh build build/asan

# The quick one, without the package set-up: the tests tests/tests.list marks "check" (every
# C unit test and the fast shell tests), normal build only (docs/hacking.md).
check:
	@$(MAKE) --no-print-directory $(JFLAG) tests
	@CHECK=1 tests/run.sh build

demo: setup
	@$(MAKE) --no-print-directory all
	@tests/demo.sh

bench: setup-test
	@$(MAKE) --no-print-directory all
	@tests/bench.sh

fuzz: setup-test
	@tests/fuzz.sh $(FUZZ_TIME)

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)

# Installation (docs/service.md). The config is installed only where none exists, and
# uninstall leaves it (it is the operator's).
PREFIX     ?= /usr/local
SYSCONFDIR ?= /etc
BINDIR     ?= $(PREFIX)/bin
UNITDIR    ?= $(PREFIX)/lib/systemd/system
DOCDIR     ?= $(PREFIX)/share/doc/kvasir
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR) $(DESTDIR)$(SYSCONFDIR)/kvd
	install -m 0755 $(B)/kvd $(B)/kvctl $(DESTDIR)$(BINDIR)/
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
	    contrib/kvd.service.in > $(DESTDIR)$(UNITDIR)/kvd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/kvd.service
	[ -e $(DESTDIR)$(SYSCONFDIR)/kvd/kvd.conf ] || install -m 0644 contrib/kvd.conf $(DESTDIR)$(SYSCONFDIR)/kvd/kvd.conf
	install -m 0644 README.md docs/*.md $(DESTDIR)$(DOCDIR)/

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/kvd $(DESTDIR)$(BINDIR)/kvctl $(DESTDIR)$(UNITDIR)/kvd.service
	rm -rf $(DESTDIR)$(DOCDIR)

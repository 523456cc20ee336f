# mgc: build the compiler/trainer, run the tests.
#   make            build ./mgc
#   make test       everything that needs no GPU (minutes); SUITE=name[,name]: those suites
#   make unit       the unit test programs (build/unit_*)
#   make golden     rewrite tests/golden/ after an intended change
#   make fuzz       the fuzz target (clang, libFuzzer, ASan + UBSan) for
#                   FUZZ_RUNS executions (10 million), FUZZ_JOBS processes
#   make SANITIZE=address,undefined BUILD=build/san BIN=build/san/mgc
#                   a sanitizer build beside the normal one (make test runs it)

CC      ?= cc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN     = -std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
BUILD   ?= build
BIN     ?= mgc
CPPFLAGS = -D_GNU_SOURCE

# The layers, enforced: each folder compiles with the include paths of the
# folders below it only, so an include the wrong way fails to build.
#   ir  <-  frontend, codegen  <-  pipeline (frontend, codegen)
#   codegen  <-  runtime (codegen)  <-  data (runtime)  <-  train (codegen, runtime, data)
#   data  <-  export (codegen, runtime, data)
#   pipeline, train, export  <-  driver
INC_ir       = -Iir
INC_frontend = -Iir -Ifrontend -I$(BUILD)
INC_codegen  = -Iir -Icodegen
INC_pipeline = -Iir -Ifrontend -Icodegen -Ipipeline -I$(BUILD)
INC_runtime  = -Iir -Icodegen -Iruntime
INC_data     = -Iir -Icodegen -Iruntime -Idata
INC_train    = -Iir -Icodegen -Iruntime -Idata -Itrain
INC_export   = -Iir -Icodegen -Iruntime -Idata -Iexport
INC_driver   = -Iir -Ifrontend -Icodegen -Ipipeline -Iruntime -Idata -Itrain -Iexport -I$(BUILD)
INC_tests    = $(INC_driver)
inc_of = $(INC_$(firstword $(subst /, ,$(1))))
LDLIBS   = -lopenblas -lz -ldl -lm -lpthread

# MPI (Open MPI) when its compiler wrapper is found: mgc then joins the ranks of
# an mpirun launch. Without it mgc builds and runs the same, one process.
# MPI=0 builds without it.
MPICC   ?= $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPI),0)
ifneq ($(MPICC),)
HAVE_MPI := 1
CPPFLAGS += -DHAVE_MPI $(shell $(MPICC) --showme:compile)
LDLIBS   += $(shell $(MPICC) --showme:link)
endif
endif
ifdef SANITIZE
# UBSan's null checks make GCC 12 see a NULL format on a path that cannot run
# (-Wformat-overflow/-truncation false positives in diag.c and arena.c).
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -Wno-format-overflow -Wno-format-truncation
LDFLAGS += -fsanitize=$(SANITIZE)
endif

# The CUDA toolkit when found: NVRTC (mgc --emit ptx needs no GPU or driver)
# and the CUDA device (runtime/device_cuda.c). NVRTC, the driver, cuBLAS and
# NCCL are all opened at run time (dlopen), so the binary starts, and trains
# on CPU devices, where they are missing.
# NCCL's header decides whether replicas on several GPUs can sum. CUDA=0
# builds without any of it.
CUDA_HOME ?= /usr/local/cuda
NCCL_HOME ?= $(CUDA_HOME)
ifneq ($(CUDA),0)
ifneq ($(wildcard $(CUDA_HOME)/include/nvrtc.h),)
HAVE_NVRTC := 1
NVRTC_SONAME := $(or $(shell objdump -p $(CUDA_HOME)/lib64/libnvrtc.so 2>/dev/null | awk '/SONAME/ { print $$2 }'),libnvrtc.so)
$(BUILD)/runtime/ptx.o: CPPFLAGS += -DHAVE_NVRTC -I$(CUDA_HOME)/include -DMGC_NVRTC_SONAME='"$(NVRTC_SONAME)"' \
    -DMGC_CUDA_LIB='"$(CUDA_HOME)/lib64"'

ifneq ($(wildcard $(CUDA_HOME)/include/cuda.h),)
ifneq ($(wildcard $(CUDA_HOME)/include/cublas_v2.h),)
HAVE_CUDA := 1
CUDA_DEFS = -DHAVE_CUDA -isystem $(CUDA_HOME)/include -DMGC_CUDA_LIB='"$(CUDA_HOME)/lib64"'
ifneq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
HAVE_NCCL := 1
CUDA_DEFS += -DHAVE_NCCL -isystem $(NCCL_HOME)/include
endif
$(BUILD)/runtime/device_cuda.o: CPPFLAGS += $(CUDA_DEFS)
endif
endif
endif
endif

# ONNX export (export/onnx.c) when protoc-c, protobuf-c's header and ONNX's own
# onnx.proto are found (Debian: protobuf-c-compiler libprotobuf-c-dev
# libonnx-dev): $(BUILD)/onnx.pb-c.[ch] are generated from the .proto, and
# mgc links -lprotobuf-c. Without them mgc builds the same and
# mgc export --format onnx says what to install. ONNX=0 builds without it.
PROTOC_C   ?= $(shell command -v protoc-c 2>/dev/null)
ONNX_PROTO ?= /usr/include/onnx/onnx.proto
ONNX_OBJ    =
ifneq ($(ONNX),0)
ifneq ($(PROTOC_C),)
ifneq ($(wildcard $(ONNX_PROTO)),)
ifneq ($(wildcard /usr/include/protobuf-c/protobuf-c.h),)
HAVE_ONNX := 1
ONNX_OBJ   = $(BUILD)/onnx.pb-c.o
LDLIBS    += -lprotobuf-c
$(BUILD)/export/onnx.o: CPPFLAGS += -DHAVE_ONNX -I$(BUILD)
endif
endif
endif
endif

# Image folders (data/data_images.c: torchvision's ImageFolder layout) decoded by libpng and
# libjpeg(-turbo) where their headers are (Debian: libpng-dev libjpeg62-turbo-dev); IMAGES=0 builds
# without, and such a folder is refused with what to install.
ifneq ($(IMAGES),0)
ifneq ($(wildcard /usr/include/png.h),)
ifneq ($(wildcard /usr/include/jpeglib.h),)
HAVE_IMAGES := 1
LDLIBS += -lpng -ljpeg
$(BUILD)/data/data_images.o: CPPFLAGS += -DHAVE_IMAGES
endif
endif
endif

# TensorBoard's event files (train/tensorboard.c, --tensorboard) when protoc-c and protobuf-c's
# header are found: $(BUILD)/tensorboard.pb-c.[ch] from train/tensorboard.proto. TB=0 builds without.
TB_OBJ =
ifneq ($(TB),0)
ifneq ($(PROTOC_C),)
ifneq ($(wildcard /usr/include/protobuf-c/protobuf-c.h),)
HAVE_TB := 1
TB_OBJ   = $(BUILD)/tensorboard.pb-c.o
ifndef HAVE_ONNX
LDLIBS  += -lprotobuf-c
endif
$(BUILD)/train/tensorboard.o: CPPFLAGS += -DHAVE_TB -I$(BUILD)
endif
endif
endif

SRC  = $(wildcard ir/*.c frontend/*.c codegen/*.c pipeline/*.c runtime/*.c data/*.c train/*.c export/*.c driver/*.c)
OBJ  = $(patsubst %.c,$(BUILD)/%.o,$(SRC)) $(BUILD)/parser.tab.o $(BUILD)/lexer.o $(ONNX_OBJ) $(TB_OBJ)

all: $(BIN)

# mgc_sbgemm and its packed form (runtime/bgemm.c, the bf16 GEMM) are exported: the
# kernel libraries mgc compiles and opens call them, as they call OpenBLAS's cblas_sgemm.
BGEMM_EXPORTS = $(foreach f,mgc_sbgemm mgc_sbgemm_pack_a mgc_sbgemm_packed mgc_sbgemm_free,-Wl,--export-dynamic-symbol=$(f))
$(BIN): $(OBJ)
	$(CC) $(LDFLAGS) $(BGEMM_EXPORTS) -o $@ $(OBJ) $(LDLIBS)
	@echo "mgc: built $@ with CPU devices$(if $(HAVE_MPI), and MPI ($(MPICC)), without MPI ($(if $(filter 0,$(MPI)),MPI=0,no mpicc found)))"
	@echo "     $(if $(HAVE_ONNX),ONNX export ($(ONNX_PROTO) through $(PROTOC_C)),no ONNX export ($(if $(filter 0,$(ONNX)),ONNX=0,needs protoc-c and protobuf-c and $(ONNX_PROTO): apt-get install protobuf-c-compiler libprotobuf-c-dev libonnx-dev)))"
	@echo "     $(if $(HAVE_IMAGES),image folders (libpng, libjpeg),no image folders ($(if $(filter 0,$(IMAGES)),IMAGES=0,needs libpng and libjpeg: apt-get install libpng-dev libjpeg62-turbo-dev)))"
	@echo "     $(if $(HAVE_TB),TensorBoard event files (protobuf-c),no TensorBoard event files ($(if $(filter 0,$(TB)),TB=0,needs protoc-c and protobuf-c: apt-get install protobuf-c-compiler libprotobuf-c-dev)))"
	@echo "     $(if $(HAVE_CUDA),CUDA devices ($(CUDA_HOME): NVRTC, driver, cuBLAS opened at run time)$(if $(HAVE_NCCL), with NCCL ($(NCCL_HOME)),; without NCCL (no $(NCCL_HOME)/include/nccl.h): one GPU only),$(if $(HAVE_NVRTC),NVRTC ($(CUDA_HOME)) for --emit ptx; no CUDA devices (no cuda.h or cublas_v2.h),no CUDA ($(if $(filter 0,$(CUDA)),CUDA=0,no $(CUDA_HOME)/include/nvrtc.h))))"


$(BUILD)/parser.tab.c $(BUILD)/parser.tab.h &: frontend/parser.y
	@mkdir -p $(BUILD)
	bison -Wall -d -o $(BUILD)/parser.tab.c $<

$(BUILD)/lexer.c: frontend/lexer.l $(BUILD)/parser.tab.h
	@mkdir -p $(BUILD)
	flex -o $@ $<

# Generated C is not ours to lint: relax the warnings that flex/bison trip.
$(BUILD)/parser.tab.o $(BUILD)/lexer.o: %.o: %.c
	$(CC) $(CPPFLAGS) $(INC_frontend) $(CFLAGS) -std=c11 -Wall -Wno-unused-function -Wno-sign-compare -c -o $@ $<

# ONNX's messages as C structs, from ONNX's own .proto (protobuf-c)
ifdef HAVE_ONNX
$(BUILD)/export/onnx.o: $(BUILD)/onnx.pb-c.h
endif
$(BUILD)/onnx.pb-c.c $(BUILD)/onnx.pb-c.h &: $(ONNX_PROTO)
	@mkdir -p $(BUILD)
	$(PROTOC_C) --c_out=$(BUILD) --proto_path=$(dir $(ONNX_PROTO)) $(notdir $(ONNX_PROTO))
$(BUILD)/onnx.pb-c.o: $(BUILD)/onnx.pb-c.c
	$(CC) $(CPPFLAGS) $(CFLAGS) -std=c11 -Wall -c -o $@ $<
# TensorBoard's messages (the subset train/tensorboard.proto holds)
ifdef HAVE_TB
$(BUILD)/train/tensorboard.o: $(BUILD)/tensorboard.pb-c.h
endif
$(BUILD)/tensorboard.pb-c.c $(BUILD)/tensorboard.pb-c.h &: train/tensorboard.proto
	@mkdir -p $(BUILD)
	$(PROTOC_C) --c_out=$(BUILD) --proto_path=train tensorboard.proto
$(BUILD)/tensorboard.pb-c.o: $(BUILD)/tensorboard.pb-c.c
	$(CC) $(CPPFLAGS) $(CFLAGS) -std=c11 -Wall -c -o $@ $<

$(BUILD)/%.o: %.c $(BUILD)/parser.tab.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(call inc_of,$<) $(CFLAGS) $(WARN) -MMD -MP -c -o $@ $<

-include $(OBJ:.o=.d)
# the exported library's fixed files, embedded in mgc by .incbin (not seen by -MMD)
$(BUILD)/export/clib_files.o: $(wildcard export/clib/*)

# The unit test programs (tests/unit_*.c), each linked with what it tests;
# make unit builds them all, make test runs them.
UNIT_OBJ  = $(filter-out $(BUILD)/driver/%,$(OBJ))
FE_OBJ    = $(filter $(BUILD)/frontend/% $(BUILD)/ir/%,$(OBJ)) $(BUILD)/parser.tab.o $(BUILD)/lexer.o
CG_OBJ    = $(filter $(BUILD)/codegen/% $(BUILD)/pipeline/%,$(OBJ))
UNIT_WARN = $(WARN) -Wno-missing-prototypes
$(BUILD)/unit_frontend: tests/unit_frontend.c $(FE_OBJ)
	$(CC) $(CPPFLAGS) $(INC_tests) $(CFLAGS) $(UNIT_WARN) -o $@ $< $(FE_OBJ) -lm
$(BUILD)/unit_verify: tests/unit_verify.c $(FE_OBJ) $(CG_OBJ)
	$(CC) $(CPPFLAGS) $(INC_tests) $(CFLAGS) $(UNIT_WARN) -o $@ $< $(FE_OBJ) $(CG_OBJ) -lm
# the runtime's data, checkpoint, store check and NVRTC pieces on their own (no CUDA headers: NVRTC is opened by name)
UNIT_RT_SRC = data/data.c data/data_cifar.c data/data_st.c data/data_images.c data/digest.c data/transform.c data/safetensors.c data/json.c data/paths.c runtime/rng.c runtime/ptx.c \
              runtime/memlimit.c runtime/store.c ir/graph.c ir/arena.c
$(BUILD)/unit_runtime: tests/unit_runtime.c $(UNIT_RT_SRC) $(wildcard runtime/*.h data/*.h)
	@mkdir -p $(BUILD)
	$(CC) -D_GNU_SOURCE $(INC_data) $(CFLAGS) $(UNIT_WARN) -Wno-unused-function -o $@ tests/unit_runtime.c $(UNIT_RT_SRC) -lz -lm -lpthread -ldl
$(BUILD)/unit_comm: tests/unit_comm.c $(UNIT_OBJ)
	$(CC) $(CPPFLAGS) $(INC_tests) $(CFLAGS) $(UNIT_WARN) -o $@ $< $(UNIT_OBJ) $(LDLIBS)
# the bf16 GEMM on its own (both of its paths where the CPU has AVX512_BF16)
$(BUILD)/unit_bgemm: tests/unit_bgemm.c runtime/bgemm.c runtime/bgemm.h
	@mkdir -p $(BUILD)
	$(CC) -D_GNU_SOURCE -Iruntime $(CFLAGS) $(UNIT_WARN) -o $@ tests/unit_bgemm.c runtime/bgemm.c -lopenblas -lm
# the ONNX export on graphs the command line cannot give it (refusals), its model read back with protobuf-c
$(BUILD)/unit_export: tests/unit_export.c $(UNIT_OBJ)
	$(CC) $(CPPFLAGS) $(if $(HAVE_ONNX),-DHAVE_ONNX -I$(BUILD)) $(INC_tests) $(CFLAGS) $(UNIT_WARN) -o $@ $< $(UNIT_OBJ) $(LDLIBS)
# the PyTorch export's refusals, on graphs damaged in memory
$(BUILD)/unit_export_py: tests/unit_export_py.c $(UNIT_OBJ)
	$(CC) $(CPPFLAGS) $(INC_tests) $(CFLAGS) $(UNIT_WARN) -o $@ $< $(UNIT_OBJ) $(LDLIBS)
UNITS = $(BUILD)/unit_frontend $(BUILD)/unit_verify $(BUILD)/unit_runtime $(BUILD)/unit_comm $(BUILD)/unit_bgemm $(BUILD)/unit_export \
        $(BUILD)/unit_export_py
unit: $(UNITS)

# make test: every suite (tests/run.sh); make test SUITE=cli (or SUITE=cli,dp) runs those alone
test: mgc
	@SUITE="$(SUITE)" bash tests/run.sh

# The fuzz target (tests/fuzz/fuzz_net.c): the front end, the passes and
# codegen on arbitrary bytes, with libFuzzer, ASan and UBSan (clang and
# libclang-rt-dev). No MPI, CUDA or runtime: nothing it compiles is run.
FUZZ_CC    ?= clang
FUZZ_RUNS  ?= 10000000
FUZZ_JOBS  ?= 1
FUZZ_FLAGS  = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_SRC    = tests/fuzz/fuzz_net.c $(wildcard ir/*.c frontend/*.c codegen/*.c pipeline/*.c) $(BUILD)/parser.tab.c $(BUILD)/lexer.c
$(BUILD)/fuzz/fuzz_net: $(FUZZ_SRC) $(wildcard ir/*.h frontend/*.h codegen/*.h pipeline/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -std=c11 -D_GNU_SOURCE $(INC_pipeline) -o $@ $(FUZZ_SRC) -lm

fuzz: $(BUILD)/fuzz/fuzz_net
	@bash tests/fuzz/run.sh $(BUILD)/fuzz/fuzz_net $(FUZZ_RUNS) $(FUZZ_JOBS)

golden: mgc
	@bash tests/golden.sh --update

# make install [PREFIX=/usr/local] [DESTDIR=]: the binary, the nets and the documentation
PREFIX ?= /usr/local
install: mgc
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/mgc/nets $(DESTDIR)$(PREFIX)/share/doc/mgc
	install -m 755 mgc $(DESTDIR)$(PREFIX)/bin/mgc
	install -m 644 nets/*.net $(DESTDIR)$(PREFIX)/share/mgc/nets/
	install -m 644 README.md docs/*.md $(DESTDIR)$(PREFIX)/share/doc/mgc/

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/mgc
	rm -rf $(DESTDIR)$(PREFIX)/share/mgc $(DESTDIR)$(PREFIX)/share/doc/mgc

clean:
	rm -rf build mgc

.PHONY: all test golden clean fuzz unit install uninstall

# mgc: build the compiler/trainer, run the tests.
#   make            build ./mgc
#   make test       everything that needs no GPU (minutes)
#   make golden     rewrite tests/golden/ after an intended change
#   make SANITIZE=address,undefined   sanitizer build

CC      ?= cc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN     = -std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CPPFLAGS = -D_GNU_SOURCE -I. -Iir -Ifrontend -Icodegen -Iruntime -Ibuild
LDLIBS   = -lopenblas -lz -ldl -lm -lpthread
ifdef SANITIZE
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
LDFLAGS += -fsanitize=$(SANITIZE)
endif

SRC  = $(wildcard ir/*.c frontend/*.c codegen/*.c runtime/*.c)
GEN  = build/parser.tab.c build/lexer.c
OBJ  = $(patsubst %.c,build/%.o,$(SRC)) build/parser.tab.o build/lexer.o

all: mgc

mgc: $(OBJ)
	$(CC) $(LDFLAGS) -o $@ $(OBJ) $(LDLIBS)

build/parser.tab.c build/parser.tab.h &: frontend/parser.y
	@mkdir -p build
	bison -Wall -d -o build/parser.tab.c $<

build/lexer.c: frontend/lexer.l build/parser.tab.h
	@mkdir -p build
	flex -o $@ $<

# Generated C is not ours to lint: relax the warnings that flex/bison trip.
build/parser.tab.o build/lexer.o: %.o: %.c
	$(CC) $(CPPFLAGS) $(CFLAGS) -std=c11 -Wall -Wno-unused-function -Wno-sign-compare -c -o $@ $<

build/%.o: %.c build/parser.tab.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -MMD -MP -c -o $@ $<

-include $(OBJ:.o=.d)

test: mgc
	@bash tests/run.sh

golden: mgc
	@bash tests/golden.sh --update

clean:
	rm -rf build mgc

.PHONY: all test golden clean

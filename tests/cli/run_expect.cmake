# Runs a command and checks its exit code and output. The log is on stderr and the results on stdout (Note [Log on
# stderr] in core/logging.h); the regex may match stderr followed by stdout (a run's log lines, then its result
# line) or stdout followed by stderr (generate's text, then its closing count). Reading the two pipes into one
# variable would order them by arrival, which is not deterministic for writes that follow each other closely.
#   cmake -DEXE=<program> -DARGS="a|b|c" -DEXPECT_RC=<n> -DEXPECT_REGEX=<regex> -P run_expect.cmake
# ARGS separates arguments with '|' (CTest would split a ';' list). EXPECT_REGEX may be empty.
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${EXE}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("exit code ${rc}\n--- stdout ---\n${out}--- stderr ---\n${err}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "expected exit code ${EXPECT_RC}, got ${rc}")
endif()
if(NOT "${EXPECT_REGEX}" STREQUAL "" AND NOT "${err}${out}" MATCHES "${EXPECT_REGEX}"
   AND NOT "${out}${err}" MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "the output does not match: ${EXPECT_REGEX}")
endif()

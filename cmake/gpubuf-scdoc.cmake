# Render one scdoc page: cmake -DSCDOC=scdoc -DIN=page.scd -DOUT=page -P gpubuf-scdoc.cmake
# scdoc reads standard input and writes standard output; a failed run leaves no
# half-written page behind.
execute_process(COMMAND "${SCDOC}" INPUT_FILE "${IN}" OUTPUT_FILE "${OUT}.tmp"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE "${OUT}.tmp")
  message(FATAL_ERROR "scdoc failed on ${IN}: ${rc}")
endif()
file(RENAME "${OUT}.tmp" "${OUT}")

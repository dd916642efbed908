# Fails unless README contains EXAMPLE's text verbatim as a ```cpp code block
# (ctest: example_decode_step_matches_readme).
file(READ "${README}" readme)
file(READ "${EXAMPLE}" code)
string(FIND "${readme}" "```cpp\n${code}```\n" at)
if(at EQUAL -1)
  get_filename_component(name "${EXAMPLE}" NAME)
  message(FATAL_ERROR "README.md does not quote ${name} verbatim in a ```cpp block: copy the file "
                      "into the README's code block (or the block into the file)")
endif()

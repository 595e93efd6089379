#include "tern.h"
int main(void) { return 0; }

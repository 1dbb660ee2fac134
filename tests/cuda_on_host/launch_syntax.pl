#!/usr/bin/perl
# launch_syntax.pl IN.cu OUT.cpp — rewrites CUDA's launch syntax so g++ can compile a .cu file against the
# emulated device (include/cuda_runtime.h):
#   kernel<T, U><<<grid, block, shared, stream>>>(a, b);
#   -> ::ferry::emu::launch(::ferry::emu::LaunchConfig{grid, block, shared, stream},
#                           [](auto&&... ferry_emu_a) { kernel<T, U>(ferry_emu_a...); }, a, b);
# The generic lambda lets the call deduce template arguments, as a launch does. A #line directive keeps
# diagnostics and __FILE__ pointing at the .cu file. Fails if any "<<<" is left.
use strict;
use warnings;
my ($in, $out) = @ARGV;
open(my $fh, '<', $in) or die "launch_syntax.pl: cannot read $in: $!\n";
local $/;
my $text = <$fh>;
close($fh);
my $count = ($text =~ s{([A-Za-z_][\w:]*(?:<[^;{}<>]*(?:<[^;{}<>]*>[^;{}<>]*)*>)?)\s*<<<(.*?)>>>\s*\((.*?)\)\s*;}
  {::ferry::emu::launch(::ferry::emu::LaunchConfig{$2}, [](auto&&... ferry_emu_a) { $1(ferry_emu_a...); }, $3);}gs);
die "launch_syntax.pl: a launch in $in was not rewritten\n" if $text =~ /<<</;
open(my $oh, '>', $out) or die "launch_syntax.pl: cannot write $out: $!\n";
print $oh "#line 1 \"$in\"\n", $text;
close($oh);
